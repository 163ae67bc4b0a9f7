//! Math answer: a reward function that pulls the final number out of each player's last reply
//! and compares it with the task's `answer` (1 if equal within 1e-6 relative, else 0).
//!
//! Task (JSON): any object with a numeric `answer`, such as the tasks of `arithmetic`.

use opentinker_sdk::text::last_number;
use opentinker_sdk::{PluginError, Reward, Transcript};

pub struct MathAnswer;

fn task_answer(task: &str) -> Result<f64, PluginError> {
    let value: serde_json::Value = serde_json::from_str(task)
        .map_err(|e| PluginError::new(format!("math-answer task: {e}")))?;
    value
        .get("answer")
        .and_then(serde_json::Value::as_f64)
        .ok_or_else(|| PluginError::new("math-answer task: no numeric `answer` field"))
}

/// The final number of the player's last assistant message.
pub fn final_answer(transcript: &Transcript) -> Option<f64> {
    let reply = transcript
        .messages
        .iter()
        .rev()
        .find(|m| m.role == "assistant")?;
    last_number(&reply.content)
}

impl Reward for MathAnswer {
    fn score(
        _config: &str,
        task: &str,
        transcripts: &[Transcript],
    ) -> Result<Vec<f64>, PluginError> {
        let answer = task_answer(task)?;
        let tolerance = 1e-6 * answer.abs().max(1.0);
        Ok(transcripts
            .iter()
            .map(|t| match final_answer(t) {
                Some(given) if (given - answer).abs() <= tolerance => 1.0,
                _ => 0.0,
            })
            .collect())
    }
}

opentinker_sdk::export_reward!(MathAnswer);

#[cfg(test)]
mod tests {
    use super::*;
    use opentinker_sdk::Message;

    fn transcript(replies: &[&str]) -> Transcript {
        let mut messages = vec![Message::user("What is 6 * 7?")];
        messages.extend(replies.iter().map(|r| Message::assistant(*r)));
        Transcript {
            player: 0,
            messages,
        }
    }

    #[test]
    fn scores_the_final_number_of_the_last_reply() {
        let task = r#"{"a": 6, "b": 7, "op": "*", "answer": 42}"#;
        let scores = MathAnswer::score(
            "{}",
            task,
            &[
                transcript(&["41", "so it is 42"]),
                transcript(&["42", "no: 43"]),
                transcript(&[]),
            ],
        )
        .unwrap();
        assert_eq!(scores, vec![1.0, 0.0, 0.0]);
    }

    #[test]
    fn a_task_without_an_answer_is_an_error() {
        let err =
            MathAnswer::score("{}", r#"{"question": "?"}"#, &[transcript(&["1"])]).unwrap_err();
        assert!(err.message.contains("answer"), "{err}");
    }
}
