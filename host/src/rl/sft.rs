//! Supervised data as token sequences on the RL data path: a chat conversation is rendered turn by
//! turn exactly as a rollout would have been (context, then each assistant message as an action,
//! then the next messages), so its datum weighs the assistant tokens only.
//!
//! The file format is JSON Lines, one conversation per line: `{"messages": [{"role": "user",
//! "content": "..."}, {"role": "assistant", "content": "..."}]}`.

use std::path::Path;

use serde::Deserialize;

use super::render::Renderer;
use super::transcript::{TokenSequence, Transcript};
use crate::model::ChatMessage;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rl::transcript::SpanKind;

    fn message(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    #[test]
    fn only_assistant_tokens_are_actions_and_the_tokens_are_the_whole_rendering() {
        let dir = tempfile::tempdir().unwrap();
        crate::model::tiny::init_tiny(
            dir.path(),
            crate::model::tiny::TinyShape::Tiny,
            crate::model::Architecture::Qwen2,
            0,
        )
        .unwrap();
        let load = || crate::model::Model::load(dir.path()).unwrap();
        let (model, template) = (load(), load().chat_template.unwrap());
        let renderer = Renderer::new(
            model.chat_template.unwrap(),
            std::sync::Arc::new(model.tokenizer),
        )
        .unwrap();
        let conversation = [
            message("system", "Be brief."),
            message("user", "2 + 2?"),
            message("assistant", "4"),
            message("user", "And 3 + 3?"),
            message("assistant", "6"),
            message("user", "Thanks."),
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
