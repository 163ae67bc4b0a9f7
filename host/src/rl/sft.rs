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
use super::datum::{Datum, sft_datum};
use super::job::{Job, SftSection};
use super::metrics::{Evaluation, Phase, StepMetrics, errors, mean};
use super::render::Renderer;
use super::rollout::Actor;
use super::train_step::{LossFn, forward_cross_entropy, loss_per_token, train_step};
use super::transcript::{TokenSequence, Transcript};
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

/// Where SFT batches come from.
enum SftData {
    /// Episodes played with the environment's demonstration actions.
    Demonstrations,
    /// Chat conversations from a file, and the datums of the held-out ones.
    Conversations {
        train: Vec<TokenSequence>,
        held_out: Vec<Datum>,
    },
}

impl SftData {
    fn load(sft: &SftSection, renderer: &Renderer) -> anyhow::Result<Self> {
        let Some(file) = sft.jsonl() else {
            return Ok(SftData::Demonstrations);
        };
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
}

/// Supervised steps (the `[sft]` section: demonstrations or a chat file), training `trainer`.
/// Returns the held-out loss before and after, when there is a held-out set.
pub(super) async fn run_sft(
    cx: &JobContext,
    job: &Job,
    sft: &SftSection,
    trainer: &dyn TrainingClient,
    reporter: &mut Reporter,
) -> anyhow::Result<Option<(Evaluation, Evaluation)>> {
    let data = SftData::load(sft, &cx.model.renderer)?;
    let held_out_loss = async || -> anyhow::Result<Option<Evaluation>> {
        let SftData::Conversations { held_out, .. } = &data else {
            return Ok(None);
        };
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
    let mut last = initial.clone();
    for step in 0..sft.steps {
        let started = Instant::now();
        let (datums, outcomes) = match &data {
            SftData::Demonstrations => {
                let seeds: Vec<u64> = (0..sft.batch as u64)
                    .map(|i| (1 << 32) + (step * sft.batch) as u64 + i)
                    .collect();
                let outcomes =
                    play_batch(cx, job, &cx.config, &seeds, &[Actor::Demonstration], None).await?;
                let datums: Vec<Datum> = outcomes
                    .iter()
                    .filter(|o| o.error.is_none())
                    .flat_map(|o| {
                        o.transcripts
                            .iter()
                            .flatten()
                            .flat_map(|t| t.clone().into_sequences())
                    })
                    .filter_map(|s| sft_datum(&s))
                    .collect();
                (datums, outcomes)
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
            sft.schedule.rate(sft.learning_rate, step, sft.steps),
        )
        .await?;
        let (loss_value, tokens) = (trained.loss, trained.tokens);
        let due = step + 1 == sft.steps || (sft.eval_every > 0 && (step + 1) % sft.eval_every == 0);
        let eval = match due {
            true => held_out_loss().await?,
            false => None,
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
            seconds: started.elapsed().as_secs_f64(),
            ..StepMetrics::default()
        })?;
    }
    Ok(initial.zip(last))
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
