//! Supervised data as token sequences on the RL data path: a chat conversation is rendered turn by
//! turn exactly as a rollout would have been (context, then each assistant message as an action,
//! then the next messages), so its datum weighs the assistant tokens only.
//!
//! The file format is JSON Lines, one conversation per line: `{"messages": [{"role": "user",
//! "content": "..."}, {"role": "assistant", "content": "..."}]}`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use serde::Deserialize;

use super::context::{JobContext, Reporter, play_batch};
use super::datum::sft_datum;
use super::job::{Job, PLATEAU_MIN_GAIN, PLATEAU_MIN_GAIN_NATS, SftSection, StopRule};
use super::metrics::{Evaluation, Phase, StepMetrics, Warmup, errors, mean};
use super::render::Renderer;
use super::rollout::{Actor, EpisodeOutcome};
use super::train_step::{LossFn, forward_cross_entropy, loss_per_token, train_step};
use super::transcript::{TokenSequence, Transcript};
use crate::api::Datum;
use crate::client::TrainingClient;
use crate::text::ChatMessage;

/// One line of a chat JSONL file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    messages: Vec<ChatMessage>,
}

/// Read a chat JSONL file; a bad line is refused with its number and what is wrong with it.
pub fn read_conversations(path: &Path) -> anyhow::Result<Vec<Vec<ChatMessage>>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    let mut conversations = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), n + 1);
        let parsed: Line =
            serde_json::from_str(line).map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
        anyhow::ensure!(
            parsed.messages.iter().any(|m| m.role == "assistant"),
            "{}: the conversation has no assistant message to learn",
            at()
        );
        conversations.push(parsed.messages);
    }
    anyhow::ensure!(
        !conversations.is_empty(),
        "{} has no conversations",
        path.display()
    );
    Ok(conversations)
}

/// The token sequence of a conversation: every assistant message is an action (its tokens and
/// end of turn), everything else is context. Messages after the last assistant one are dropped.
pub fn conversation_sequence(
    renderer: &Renderer,
    messages: &[ChatMessage],
) -> anyhow::Result<TokenSequence> {
    let mut transcript: Option<Transcript> = None;
    let mut pending: Vec<ChatMessage> = Vec::new();
    for message in messages {
        if message.role != "assistant" {
            pending.push(message.clone());
            continue;
        }
        let context = std::mem::take(&mut pending);
        let transcript = match &mut transcript {
            Some(transcript) => {
                transcript.push_observation(renderer.continuation(true, &context)?)?;
                transcript
            }
            None => transcript.insert(Transcript::new(renderer.first_prompt(&context)?)),
        };
        let tokens = renderer.action_tokens(&message.content)?;
        let logprobs = vec![0.0; tokens.len()];
        transcript.push_action(tokens, logprobs)?;
    }
    let sequences = transcript
        .map(Transcript::into_sequences)
        .unwrap_or_default();
    sequences
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("the conversation has no assistant message"))
}

/// Where SFT batches come from, and the held-out datums whose loss evaluates the warm-up.
enum SftData {
    /// Episodes played with the environment's demonstration actions.
    Demonstrations { held_out: Vec<Datum> },
    /// Chat conversations from a file.
    Conversations {
        train: Vec<TokenSequence>,
        held_out: Vec<Datum>,
    },
}

/// The seeds of a warm-up's demonstration episodes: training batches count up from the
/// first, the held-out episodes from the second, so that the two never meet.
const TRAINING_SEEDS: u64 = 1 << 32;
const HELD_OUT_SEEDS: u64 = 2 << 32;

impl SftData {
    async fn load(cx: &JobContext, job: &Job, sft: &SftSection) -> anyhow::Result<Self> {
        let Some(file) = sft.jsonl() else {
            let seeds: Vec<u64> = (0..sft.held_out_size() as u64)
                .map(|i| HELD_OUT_SEEDS + i)
                .collect();
            let (held_out, _) = demonstrations(cx, job, &seeds).await?;
            anyhow::ensure!(
                seeds.is_empty() || !held_out.is_empty(),
                "none of the {} held-out demonstration episodes gave a datum",
                seeds.len()
            );
            return Ok(SftData::Demonstrations { held_out });
        };
        let renderer = &cx.model.renderer;
        let conversations = read_conversations(file)?;
        anyhow::ensure!(
            sft.held_out < conversations.len(),
            "sft.held_out: {} of the {} conversations of {} leaves none to train on",
            sft.held_out,
            conversations.len(),
            file.display()
        );
        let mut sequences = conversations
            .iter()
            .enumerate()
            .map(|(n, messages)| {
                conversation_sequence(renderer, messages)
                    .with_context(|| format!("{} conversation {}", file.display(), n + 1))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let held_out = sequences
            .split_off(sequences.len() - sft.held_out)
            .iter()
            .filter_map(sft_datum)
            .collect();
        Ok(SftData::Conversations {
            train: sequences,
            held_out,
        })
    }

    fn held_out(&self) -> &[Datum] {
        match self {
            SftData::Demonstrations { held_out } | SftData::Conversations { held_out, .. } => {
                held_out
            }
        }
    }
}

/// The datums of demonstration episodes of `seeds`, and the episodes' outcomes.
async fn demonstrations(
    cx: &JobContext,
    job: &Job,
    seeds: &[u64],
) -> anyhow::Result<(Vec<Datum>, Vec<EpisodeOutcome>)> {
    let outcomes = play_batch(cx, job, &cx.config, seeds, &[Actor::Demonstration], None).await?;
    let datums = outcomes
        .iter()
        .filter(|o| o.failure.is_none())
        .flat_map(|o| {
            o.transcripts
                .iter()
                .flatten()
                .flat_map(|t| t.clone().into_sequences())
        })
        .filter_map(|s| sft_datum(&s))
        .collect();
    Ok((datums, outcomes))
}

/// A plateau stop's watch over the held-out loss: the best loss so far, and the evaluations
/// since it last fell (see `job::StopRule::Plateau`).
struct Plateau {
    best: f64,
    flat: usize,
    patience: usize,
}

impl Plateau {
    /// Record an evaluation's loss; the reason to stop when the loss has been flat for
    /// `patience` evaluations.
    fn watch(&mut self, loss: f64) -> Option<String> {
        let gain = (self.best * PLATEAU_MIN_GAIN).max(PLATEAU_MIN_GAIN_NATS);
        if loss < self.best - gain {
            (self.best, self.flat) = (loss, 0);
            return None;
        }
        self.flat += 1;
        (self.flat >= self.patience).then(|| {
            format!(
                "the held-out loss per token has not fallen below {:.4} by {}% in {} evaluations",
                self.best,
                PLATEAU_MIN_GAIN * 100.0,
                self.flat
            )
        })
    }
}

/// Supervised steps (the `[sft]` section: demonstrations or a chat file), training `trainer`,
/// until `sft.steps` or, under a plateau stop, until the held-out loss stops falling.
pub(super) async fn run_sft(
    cx: &JobContext,
    job: &Job,
    sft: &SftSection,
    trainer: &dyn TrainingClient,
    reporter: &mut Reporter,
) -> anyhow::Result<Warmup> {
    if sft.implied
        && demonstrations(cx, job, &[TRAINING_SEEDS])
            .await?
            .0
            .is_empty()
    {
        tracing::warn!(
            "the environment gives no demonstrations, so the default warm-up is skipped and RL \
             starts from the base model (an [sft] section with a chat file warms it up instead)"
        );
        return Ok(Warmup::default());
    }
    let data = SftData::load(cx, job, sft).await?;
    let held_out_loss = async || -> anyhow::Result<Option<Evaluation>> {
        let held_out = data.held_out();
        if held_out.is_empty() {
            return Ok(None);
        }
        let (_, output) = forward_cross_entropy(trainer, held_out).await?;
        let (loss, _) = loss_per_token(&[output]);
        Ok(Some(Evaluation {
            episodes: held_out.len(),
            loss: Some(loss),
            ..Evaluation::default()
        }))
    };
    let initial = held_out_loss().await?;
    let mut plateau = match (sft.stop_rule(), &initial) {
        (
            StopRule::Plateau,
            Some(Evaluation {
                loss: Some(loss), ..
            }),
        ) => Some(Plateau {
            best: *loss,
            flat: 0,
            patience: sft.patience,
        }),
        _ => None,
    };
    let every = sft.eval_interval();
    let mut last = initial.clone();
    let mut steps = 0;
    for step in 0..sft.steps {
        let started = Instant::now();
        let (datums, outcomes) = match &data {
            SftData::Demonstrations { .. } => {
                let seeds: Vec<u64> = (0..sft.batch as u64)
                    .map(|i| TRAINING_SEEDS + (step * sft.batch) as u64 + i)
                    .collect();
                demonstrations(cx, job, &seeds).await?
            }
            // Batches walk through the file in order, wrapping around.
            SftData::Conversations { train, .. } => {
                let datums = (0..sft.batch)
                    .filter_map(|i| sft_datum(&train[(step * sft.batch + i) % train.len()]))
                    .collect();
                (datums, Vec::new())
            }
        };
        let trained = train_step(
            vec![(trainer, datums)],
            &LossFn::cross_entropy(),
            sft.adam(step),
        )
        .await?;
        steps = step + 1;
        let (loss_value, tokens) = (trained.loss, trained.tokens);
        let due = step + 1 == sft.steps || (every > 0 && (step + 1) % every == 0);
        let eval = match due {
            true => held_out_loss().await?,
            false => None,
        };
        let stopped = match (&mut plateau, &eval) {
            (
                Some(plateau),
                Some(Evaluation {
                    loss: Some(loss), ..
                }),
            ) => plateau.watch(*loss),
            _ => None,
        };
        if eval.is_some() {
            last = eval.clone();
        }
        reporter.line(&StepMetrics {
            step,
            phase: Phase::Sft,
            episode_steps: mean(outcomes.iter().map(|o| o.steps as f64)),
            tokens,
            loss: loss_value,
            errors: errors(&outcomes),
            error_messages: BTreeMap::new(),
            eval,
            initial_evals: match (step, &initial) {
                (0, Some(initial)) => BTreeMap::from([("held-out".to_string(), initial.clone())]),
                _ => BTreeMap::new(),
            },
            warmup_stop: stopped.clone(),
            seconds: started.elapsed().as_secs_f64(),
            ..StepMetrics::default()
        })?;
        if stopped.is_some() {
            break;
        }
    }
    Ok(Warmup {
        evals: initial.zip(last),
        steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rl::transcript::SpanKind;

    #[test]
    fn only_assistant_tokens_are_actions_and_the_tokens_are_the_whole_rendering() {
        let dir = tempfile::tempdir().unwrap();
        let (tokenizer, template) = crate::rl::render::tests::tiny_text(dir.path());
        let renderer = Renderer::new(template.clone(), tokenizer).unwrap();
        let conversation = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "2 + 2?"),
            ChatMessage::new("assistant", "4"),
            ChatMessage::new("user", "And 3 + 3?"),
            ChatMessage::new("assistant", "6"),
            ChatMessage::new("user", "Thanks."),
        ];
        let sequence = conversation_sequence(&renderer, &conversation).unwrap();
        let whole = template.render(&conversation[..5], false).unwrap();
        let expected = renderer
            .tokenizer()
            .encode_without_special_tokens(&whole)
            .unwrap();
        // The sequence ends with the last action's end of turn; the template adds a newline.
        let tokens = sequence.tokens();
        assert_eq!(&expected[..tokens.len()], tokens.as_slice());
        let rest = renderer
            .tokenizer()
            .decode(&expected[tokens.len()..])
            .unwrap();
        assert_eq!(rest.trim(), "");
        let actions: Vec<String> = sequence
            .spans
            .iter()
            .filter(|s| matches!(s.kind, SpanKind::Action { .. }))
            .map(|s| renderer.action_text(&s.tokens).unwrap())
            .collect();
        assert_eq!(actions, ["4", "6"]);
    }

    #[test]
    fn a_plateau_stop_waits_for_patience_evaluations_without_a_gain() {
        let mut plateau = Plateau {
            best: 2.0,
            flat: 0,
            patience: 2,
        };
        // Falling by more than 1%: never stops, and a flat evaluation between two falls
        // starts the count again.
        assert_eq!(plateau.watch(1.5), None);
        assert_eq!(plateau.watch(1.495), None);
        assert_eq!(plateau.watch(1.2), None);
        assert_eq!(plateau.flat, 0);
        // Less than 1% lower, then higher: two flat evaluations.
        assert_eq!(plateau.watch(1.19), None);
        let why = plateau.watch(1.3).unwrap();
        assert!(
            why.contains("1.2000") && why.contains("2 evaluations"),
            "{why}"
        );
        // Near zero, a gain must be at least the absolute floor.
        let mut plateau = Plateau {
            best: 0.01,
            flat: 0,
            patience: 1,
        };
        assert!(plateau.watch(0.0095).is_some());
    }

    #[test]
    fn a_bad_line_is_refused_with_its_number() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chat.jsonl");
        let good = r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}"#;
        std::fs::write(&path, format!("{good}\n{{\"mesages\": []}}\n")).unwrap();
        let err = read_conversations(&path).unwrap_err().to_string();
        assert!(err.contains("line 2") && err.contains("mesages"), "{err}");
        std::fs::write(
            &path,
            format!("{good}\n{}\n", good.replace("assistant", "user")),
        )
        .unwrap();
        let err = read_conversations(&path).unwrap_err().to_string();
        assert!(
            err.contains("line 2") && err.contains("no assistant"),
            "{err}"
        );
        std::fs::write(&path, format!("\n{good}\n")).unwrap();
        assert_eq!(read_conversations(&path).unwrap().len(), 1);
    }
}
