//! Distinct replies: a reward whose group scorer takes from a player's return for each other
//! episode of its group in which that player replied the same. A policy paid only for a valid
//! reply settles on the easiest valid one, the same in every episode (a proposer of problems
//! proposes `1 + 1`); this makes a group's repeated replies worth less than its distinct ones.
//!
//! Use it with `group = true` (`[reward] plugin = "plugins/distinct-replies"`); its per-episode
//! score is 0, so an evaluation, which plays no groups, is not changed. Two episodes' replies are
//! the same when all of the player's replies in each, read as `compare` says, are equal.
//!
//! Config (JSON): `players` (`[0]`: whose replies are compared; the others score 0), `penalty`
//! (0.5: what a reply every other episode of the group repeated loses; one repeated by a share
//! of them loses that share of it), `compare`: `text` (default: lowercased, without whitespace)
//! or `expression` (the first `number sign number`, so that `5 - 5` and `Try 5-5 = 0, 5 5!` are
//! the same problem: a policy cannot look distinct by what it writes around it; a reply without
//! one repeats no other).

use std::collections::HashMap;

use opentinker_sdk::{PluginError, Reward, Transcript};
use serde::Deserialize;

pub struct DistinctReplies;

#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Config {
    players: Vec<u32>,
    penalty: f64,
    compare: Compare,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            players: vec![0],
            penalty: 0.5,
            compare: Compare::Text,
        }
    }
}

/// What of a reply two episodes are compared by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Compare {
    Text,
    Expression,
}

impl Compare {
    /// What a player replied in one episode, as this comparison reads it; `None` (an
    /// expression's reply without one) is no other reply's repeat.
    fn read(self, transcript: &Transcript) -> Option<String> {
        let replied: Vec<char> = transcript
            .messages
            .iter()
            .filter(|m| m.role == "assistant")
            .flat_map(|m| m.content.chars().chain(['\n']))
            .collect();
        match self {
            Compare::Text => Some(
                replied
                    .into_iter()
                    .filter(|c| !c.is_whitespace())
                    .flat_map(char::to_lowercase)
                    .collect(),
            ),
            Compare::Expression => first_expression(&replied),
        }
    }
}

/// The first `number sign number` of `text` (spaces around the sign allowed), as `a sign b`.
fn first_expression(text: &[char]) -> Option<String> {
    let digits_from = |start: usize| {
        let end = (start..text.len())
            .find(|&i| !text[i].is_ascii_digit())
            .unwrap_or(text.len());
        (end > start).then_some(end)
    };
    let skip_spaces = |mut i: usize| {
        while text.get(i) == Some(&' ') {
            i += 1;
        }
        i
    };
    let sign = |c: char| match c {
        '+' => Some('+'),
        '-' | '−' | '–' => Some('-'),
        '*' | '×' => Some('*'),
        '/' | '÷' => Some('/'),
        _ => None,
    };
    (0..text.len())
        .filter(|&start| start == 0 || !text[start - 1].is_ascii_digit())
        .find_map(|start| {
            let a_end = digits_from(start)?;
            let at_sign = skip_spaces(a_end);
            let op = sign(*text.get(at_sign)?)?;
            let b_start = skip_spaces(at_sign + 1);
            let b_end = digits_from(b_start)?;
            let (a, b): (String, String) = (
                text[start..a_end].iter().collect(),
                text[b_start..b_end].iter().collect(),
            );
            Some(format!("{a} {op} {b}"))
        })
}

fn parse_config(config: &str) -> Result<Config, PluginError> {
    if config.trim().is_empty() {
        return Ok(Config::default());
    }
    let config: Config = serde_json::from_str(config)
        .map_err(|e| PluginError::new(format!("distinct-replies config: {e}")))?;
    if !config.penalty.is_finite() || config.penalty < 0.0 {
        return Err(PluginError::new(format!(
            "distinct-replies config: `penalty` must be a number of at least 0, not {}",
            config.penalty
        )));
    }
    Ok(config)
}

/// The JSON Schema of [`Config`], for the component's metadata.
const CONFIG_SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "players": {"type": "array", "items": {"type": "integer", "minimum": 0}, "default": [0]},
    "penalty": {"type": "number", "minimum": 0, "default": 0.5},
    "compare": {"enum": ["text", "expression"], "default": "text"}
  }
}"#;

impl Reward for DistinctReplies {
    fn score(
        config: &str,
        _task: &str,
        transcripts: &[Transcript],
    ) -> Result<Vec<f64>, PluginError> {
        parse_config(config)?;
        Ok(vec![0.0; transcripts.len()])
    }

    fn score_group(
        config: &str,
        _task: &str,
        episodes: &[Vec<Transcript>],
    ) -> Result<Option<Vec<Vec<f64>>>, PluginError> {
        let config = parse_config(config)?;
        let others = episodes.len().saturating_sub(1);
        // Each compared reply read once, as (player, reply); then how often each was given.
        let replies: Vec<Vec<Option<(u32, String)>>> = episodes
            .iter()
            .map(|episode| {
                episode
                    .iter()
                    .map(|t| {
                        let compared = config.players.contains(&t.player);
                        compared
                            .then(|| config.compare.read(t).map(|reply| (t.player, reply)))
                            .flatten()
                    })
                    .collect()
            })
            .collect();
        let mut given: HashMap<&(u32, String), usize> = HashMap::new();
        for reply in replies.iter().flatten().flatten() {
            *given.entry(reply).or_default() += 1;
        }
        let scores = replies
            .iter()
            .map(|episode| {
                episode
                    .iter()
                    .map(|reply| match reply {
                        Some(reply) if others > 0 => {
                            let repeats = given[reply] - 1;
                            -config.penalty * repeats as f64 / others as f64
                        }
                        _ => 0.0,
                    })
                    .collect()
            })
            .collect();
        Ok(Some(scores))
    }

    fn config_schema() -> Option<String> {
        Some(CONFIG_SCHEMA.to_string())
    }
}

opentinker_sdk::export_reward!(DistinctReplies);

#[cfg(test)]
mod tests {
    use super::*;
    use opentinker_sdk::Message;

    fn episode(proposal: &str, answer: &str) -> Vec<Transcript> {
        vec![
            Transcript {
                player: 0,
                messages: vec![
                    Message::user("Write a problem."),
                    Message::assistant(proposal),
                ],
            },
            Transcript {
                player: 1,
                messages: vec![Message::user(proposal), Message::assistant(answer)],
            },
        ]
    }

    fn group_scores(config: &str, episodes: &[Vec<Transcript>]) -> Vec<Vec<f64>> {
        DistinctReplies::score_group(config, "{}", episodes)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn a_reply_repeated_in_the_group_loses_its_share_of_the_penalty() {
        let episodes = [
            episode("5 - 5", "0"),
            episode("5-5", "1"),
            episode("9 - 4", "5"),
            episode("5 - 5", "0"),
            episode("12 - 7", "5"),
        ];
        let scores = group_scores("{}", &episodes);
        // `5 - 5` three times (spaces do not count): each repeated by 2 of the 4 others.
        assert_eq!(scores[0], vec![-0.25, 0.0]);
        assert_eq!(scores[1], vec![-0.25, 0.0]);
        assert_eq!(scores[3], vec![-0.25, 0.0]);
        // Distinct proposals keep their return; the solvers' equal answers are not compared.
        assert_eq!(scores[2], vec![0.0, 0.0]);
        assert_eq!(scores[4], vec![0.0, 0.0]);
    }

    #[test]
    fn an_expression_compares_the_problem_and_not_the_words_around_it() {
        let episodes = [
            episode("5 - 5", "0"),
            episode("Try 5−5 = 0, 5 5!", "0"),
            episode("5 - 55", "0"),
            episode("55 - 5 then 5 - 5", "0"),
            episode("five minus five", "0"),
            episode("no problem here", "0"),
        ];
        let scores = group_scores(r#"{"compare": "expression"}"#, &episodes);
        let proposers: Vec<f64> = scores.iter().map(|s| s[0]).collect();
        // Only the first two propose `5 - 5`; replies without an expression repeat nothing.
        assert_eq!(proposers, vec![-0.1, -0.1, 0.0, 0.0, 0.0, 0.0]);
        let scores = group_scores("{}", &episodes);
        assert!(scores.iter().all(|s| s[0] == 0.0), "{scores:?}");
    }

    #[test]
    fn a_whole_group_of_one_reply_loses_the_whole_penalty() {
        let episodes = vec![episode("1 + 1", "2"); 8];
        let scores = group_scores(r#"{"penalty": 1.0}"#, &episodes);
        assert!(scores.iter().all(|s| s == &vec![-1.0, 0.0]), "{scores:?}");
    }

    #[test]
    fn the_configured_players_are_compared_and_one_episode_is_never_penalised() {
        let episodes = [episode("1 + 1", "2"), episode("3 + 4", "2")];
        let scores = group_scores(r#"{"players": [1]}"#, &episodes);
        assert_eq!(scores, vec![vec![0.0, -0.5], vec![0.0, -0.5]]);
        let alone = group_scores("{}", &episodes[..1]);
        assert_eq!(alone, vec![vec![0.0, 0.0]]);
        let each = DistinctReplies::score("{}", "{}", &episodes[0]).unwrap();
        assert_eq!(each, vec![0.0, 0.0]);
    }

    #[test]
    fn a_bad_config_is_refused_by_name() {
        let err = DistinctReplies::score_group(r#"{"penalti": 1}"#, "{}", &[]).unwrap_err();
        assert!(err.message.contains("penalti"), "{err}");
        let err = DistinctReplies::score_group(r#"{"penalty": -1}"#, "{}", &[]).unwrap_err();
        assert!(err.message.contains("penalty"), "{err}");
    }
}
