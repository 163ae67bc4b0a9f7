//! Chat templates: the Jinja template a model ships (`tokenizer_config.json` or
//! `chat_template.jinja`), rendered with minijinja the way `transformers`' `apply_chat_template`
//! renders it (trimmed blocks, Python string methods, `raise_exception`).

use minijinja::{Environment, Error, ErrorKind, context};
use serde::Serialize;

/// One message of a conversation, as templates see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template with the special tokens it may refer to.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compile `source`; a template that does not parse is refused with minijinja's message.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, Error> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", |_format: String| "1970-01-01".to_string());
        env.add_template_owned("chat", source.to_string())?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The template's end-of-sequence token text (`eos_token` of `tokenizer_config.json`).
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Render a conversation; `add_generation_prompt` opens the assistant's turn.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        self.env.get_template("chat")?.render(context! {
            messages => minijinja::value::Serde(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml_with_a_generation_prompt() {
        let template = ChatTemplate::new(CHATML, "", "<|im_end|>").unwrap();
        let messages = [ChatMessage {
            role: "user".into(),
            content: "hi".into(),
        }];
        assert_eq!(
            template.render(&messages, true).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_and_python_methods_work() {
        let source = "{% if messages[0].content.strip() == '' %}{{ raise_exception('empty') }}{% endif %}{{ messages[0].content.upper() }}";
        let template = ChatTemplate::new(source, "", "").unwrap();
        let ok = [ChatMessage {
            role: "user".into(),
            content: " a ".into(),
        }];
        assert_eq!(template.render(&ok, false).unwrap(), " A ");
        let empty = [ChatMessage {
            role: "user".into(),
            content: "  ".into(),
        }];
        assert!(
            template
                .render(&empty, false)
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
    }
}
