//! Token-in, token-out rendering with the model's chat template: the first prompt of a player,
//! then, after each sampled completion, only the tokens of the new messages and the next
//! generation prompt. The history is never rendered again, so the tokens the policy sampled stay
//! exactly as sampled.
//!
//! The template's glue is learned once from a probe conversation: what follows an assistant
//! message's content (its end-of-turn token, then e.g. a newline), and how new messages render
//! after a finished assistant turn.

use std::sync::Arc;

use crate::text::{ChatMessage, ChatTemplate, Tokenizer};

const PROBE_USER: &str = "opentinker-probe-user";
const PROBE_ASSISTANT: &str = "opentinker-probe-assistant";

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("chat template: {0}")]
    Template(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error(
        "the chat template does not render a conversation as a prefix of its continuation, so \
         turns cannot be appended token by token: {0}"
    )]
    NotIncremental(String),
}

/// Renders a player's messages to tokens with a chat template.
pub struct Renderer {
    template: ChatTemplate,
    tokenizer: Arc<Tokenizer>,
    /// The template's end-of-turn text (`eos_token`), which a completion ends with.
    end_of_turn: String,
    /// What the template writes after an assistant message's end-of-turn text.
    after_turn: String,
}

impl Renderer {
    pub fn new(template: ChatTemplate, tokenizer: Arc<Tokenizer>) -> Result<Self, RenderError> {
        let end_of_turn = template.eos_token().to_string();
        let probe = probe_history();
        let rendered = render(&template, &probe, false)?;
        let content_end = rendered
            .rfind(PROBE_ASSISTANT)
            .map(|at| at + PROBE_ASSISTANT.len())
            .ok_or_else(|| {
                RenderError::NotIncremental("the assistant message is missing".into())
            })?;
        let after_content = &rendered[content_end..];
        let after_turn = after_content
            .strip_prefix(end_of_turn.as_str())
            .ok_or_else(|| {
                RenderError::NotIncremental(format!(
                    "an assistant message is not followed by the eos token {end_of_turn:?}"
                ))
            })?
            .to_string();
        Ok(Renderer {
            template,
            tokenizer,
            end_of_turn,
            after_turn,
        })
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// The id of the end-of-turn token, which ends a completion.
    pub fn end_of_turn_id(&self) -> Option<u32> {
        self.tokenizer.token_id(&self.end_of_turn)
    }

    /// The first prompt: `messages` rendered, with the generation prompt.
    pub fn first_prompt(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, RenderError> {
        let text = render(&self.template, messages, true)?;
        self.tokens(&text)
    }

    /// The tokens to append after a completion: the rest of the assistant turn's glue (the
    /// end-of-turn token too when the completion did not end with it), the new messages, and the
    /// generation prompt.
    pub fn continuation(
        &self,
        completion_ended_turn: bool,
        messages: &[ChatMessage],
    ) -> Result<Vec<u32>, RenderError> {
        let probe = probe_history();
        let before = render(&self.template, &probe, false)?;
        let mut extended = probe;
        extended.extend(messages.iter().cloned());
        let after = render(&self.template, &extended, true)?;
        let new = after.strip_prefix(before.as_str()).ok_or_else(|| {
            RenderError::NotIncremental("adding messages changed the text before them".into())
        })?;
        let mut text = String::new();
        if !completion_ended_turn {
            text.push_str(&self.end_of_turn);
        }
        text.push_str(&self.after_turn);
        text.push_str(new);
        self.tokens(&text)
    }

    /// Tokens of an action written as text (a demonstration), ended with the end-of-turn token.
    pub fn action_tokens(&self, text: &str) -> Result<Vec<u32>, RenderError> {
        self.tokens(&format!("{text}{}", self.end_of_turn))
    }

    /// The text of sampled tokens, without a final end-of-turn token.
    pub fn action_text(&self, tokens: &[u32]) -> Result<String, RenderError> {
        let tokens = match (tokens.split_last(), self.end_of_turn_id()) {
            (Some((last, rest)), Some(end)) if *last == end => rest,
            _ => tokens,
        };
        self.tokenizer
            .decode(tokens)
            .map_err(|e| RenderError::Tokenizer(e.to_string()))
    }

    fn tokens(&self, text: &str) -> Result<Vec<u32>, RenderError> {
        self.tokenizer
            .encode_without_special_tokens(text)
            .map_err(|e| RenderError::Tokenizer(e.to_string()))
    }
}

fn probe_history() -> Vec<ChatMessage> {
    vec![
        ChatMessage {
            role: "user".into(),
            content: PROBE_USER.into(),
        },
        ChatMessage {
            role: "assistant".into(),
            content: PROBE_ASSISTANT.into(),
        },
    ]
}

fn render(
    template: &ChatTemplate,
    messages: &[ChatMessage],
    generation_prompt: bool,
) -> Result<String, RenderError> {
    template
        .render(messages, generation_prompt)
        .map_err(|e| RenderError::Template(e.to_string()))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::client::{ModelText, TinyModelSpec};

    /// The tokenizer and chat template of a generated tiny model in `dir`.
    pub(in crate::rl) fn tiny_text(dir: &std::path::Path) -> (Arc<Tokenizer>, ChatTemplate) {
        let model = dir.join("model");
        TinyModelSpec::built_in().generate(&model).unwrap();
        let text = ModelText::load(&model).unwrap();
        (text.tokenizer, text.chat_template.unwrap())
    }

    /// Appending turn by turn gives exactly the tokens of rendering the whole conversation at
    /// once (when the completion is what the tokenizer would make of its text).
    #[test]
    fn appended_turns_equal_the_whole_conversation_rendered() {
        let dir = tempfile::tempdir().unwrap();
        let (tokenizer, template) = tiny_text(dir.path());
        let whole_template = ChatTemplate::new(
            &std::fs::read_to_string(dir.path().join("model/tokenizer_config.json"))
                .map(|t| {
                    serde_json::from_str::<serde_json::Value>(&t).unwrap()["chat_template"]
                        .as_str()
                        .unwrap()
                        .to_string()
                })
                .unwrap(),
            "",
            template.eos_token(),
        )
        .unwrap();
        let renderer = Renderer::new(template, Arc::clone(&tokenizer)).unwrap();
        let first = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Guess: 1-16"),
        ];
        let mut tokens = renderer.first_prompt(&first).unwrap();
        let action = renderer.action_tokens("8").unwrap();
        assert_eq!(renderer.action_text(&action).unwrap(), "8");
        tokens.extend(&action);
        let reply = [ChatMessage::new("user", "Higher.")];
        tokens.extend(renderer.continuation(true, &reply).unwrap());

        let mut conversation = first.to_vec();
        conversation.push(ChatMessage::new("assistant", "8"));
        conversation.extend(reply);
        let whole = whole_template.render(&conversation, true).unwrap();
        let expected = tokenizer.encode_without_special_tokens(&whole).unwrap();
        assert_eq!(tokens, expected);
    }
}
