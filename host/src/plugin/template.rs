//! `opentinker plugin new`: a working, documented plugin skeleton in each SDK's language, with a
//! unit test in that language's own runner, that builds and plays as written.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use super::inspect::PluginKind;

/// The languages `plugin new` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TemplateLanguage {
    Rust,
    Python,
    JavaScript,
}

/// Write a new plugin called `name` into `dir` (which must not exist, or be empty), returning the
/// files written. A Rust or JavaScript plugin depends on its language's SDK at `sdk` (a Python one
/// finds the `opentinker` package where Python does).
pub fn write_plugin(
    dir: &Path,
    name: &str,
    language: TemplateLanguage,
    kind: PluginKind,
    sdk: &Path,
) -> anyhow::Result<Vec<PathBuf>> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        || name.starts_with('-')
    {
        bail!("plugin name `{name}`: use lowercase letters, digits and `-` (like `word-guess`)");
    }
    if dir.exists()
        && std::fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .next()
            .is_some()
    {
        bail!("{} exists and is not empty: nothing written", dir.display());
    }
    let files: Vec<(&str, String)> = match language {
        TemplateLanguage::Python => python_files(name, kind)?,
        TemplateLanguage::Rust => rust_files(name, kind, sdk)?,
        TemplateLanguage::JavaScript => js_files(name, kind, sdk)?,
    };
    let mut written = Vec::new();
    for (relative, contents) in files {
        let path = dir.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// Templates exist for environments, agents and rewards; an objective or an advantage
/// estimator starts from the SDK's examples.
fn no_template(kind: PluginKind) -> anyhow::Error {
    anyhow::anyhow!(
        "there is no template for {} plugin yet: start from the SDK's documentation",
        kind.with_article()
    )
}

fn python_files(name: &str, kind: PluginKind) -> anyhow::Result<Vec<(&'static str, String)>> {
    let pyproject = format!(
        "[project]\nname = \"{name}\"\nversion = \"0.1.0\"\nrequires-python = \">=3.10\"\n\n\
         # What `opentinker plugin build` reads: the plugin's kind and the module that marks its class.\n\
         [tool.opentinker]\nkind = \"{}\"\nmodule = \"app\"\n",
        kind.interface()
    );
    let (app, test) = match kind {
        PluginKind::Environment => (PYTHON_ENVIRONMENT, PYTHON_ENVIRONMENT_TEST),
        PluginKind::Agent => (PYTHON_AGENT, PYTHON_AGENT_TEST),
        PluginKind::Reward => (PYTHON_REWARD, PYTHON_REWARD_TEST),
        other => return Err(no_template(other)),
    };
    Ok(vec![
        ("pyproject.toml", pyproject),
        ("app.py", app.replace("{name}", name)),
        ("tests/test_app.py", test.to_string()),
        (".gitignore", "target/\n__pycache__/\n".to_string()),
    ])
}

fn js_files(
    name: &str,
    kind: PluginKind,
    sdk: &Path,
) -> anyhow::Result<Vec<(&'static str, String)>> {
    let package = serde_json::json!({
        "name": name,
        "version": "0.1.0",
        "description": format!("{name}: an opentinker {}", kind.interface()),
        "type": "module",
        "opentinker": { "kind": kind.interface(), "module": "app.js" },
        "scripts": { "test": "node --test test/" },
        "devDependencies": { "opentinker": format!("file:{}", sdk.display()) },
    });
    // serde_json sorts an object's keys; package.json reads best in the order npm writes.
    let order = [
        "name",
        "version",
        "description",
        "type",
        "opentinker",
        "scripts",
        "devDependencies",
    ];
    let fields: Vec<String> = order
        .iter()
        .map(|key| {
            let value = serde_json::to_string_pretty(&package[key]).unwrap_or_default();
            format!("  \"{key}\": {}", value.replace('\n', "\n  "))
        })
        .collect();
    let package = format!("{{\n{}\n}}\n", fields.join(",\n"));
    let (app, test) = match kind {
        PluginKind::Environment => (JS_ENVIRONMENT, JS_ENVIRONMENT_TEST),
        PluginKind::Agent => (JS_AGENT, JS_AGENT_TEST),
        PluginKind::Reward => (JS_REWARD, JS_REWARD_TEST),
        other => return Err(no_template(other)),
    };
    Ok(vec![
        ("package.json", package),
        ("app.js", app.replace("{name}", name)),
        ("test/app.test.js", test.to_string()),
        (".gitignore", "target/\nnode_modules/\n".to_string()),
    ])
}

fn rust_files(
    name: &str,
    kind: PluginKind,
    sdk: &Path,
) -> anyhow::Result<Vec<(&'static str, String)>> {
    let manifest = format!(
        "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\npublish = false\n\n\
         [lib]\n# cdylib: the component; rlib: so `cargo test` runs the unit tests natively.\n\
         crate-type = [\"cdylib\", \"rlib\"]\n\n\
         [dependencies]\nopentinker-sdk = {{ path = \"{}\" }}\n\n\
         # A workspace of its own, so it builds outside any other.\n[workspace]\n\n\
         [profile.release]\nopt-level = \"s\"\nlto = true\ncodegen-units = 1\n",
        sdk.display()
    );
    let lib = match kind {
        PluginKind::Environment => RUST_ENVIRONMENT,
        PluginKind::Agent => RUST_AGENT,
        PluginKind::Reward => RUST_REWARD,
        other => return Err(no_template(other)),
    };
    Ok(vec![
        ("Cargo.toml", manifest),
        ("src/lib.rs", lib.replace("{name}", name)),
        (".gitignore", "target/\n".to_string()),
    ])
}

const PYTHON_ENVIRONMENT: &str = r#""""{name}: an opentinker environment. The policy is shown a word and must say it back.

Replace the rules with your own; keep them deterministic (use `opentinker.rng(seed)`, never the
clock), so that the same config, task, seed and actions give the same transcript.

Build and play it: `opentinker plugin run .`; test it: `python -m pytest tests`.
"""

import json
from dataclasses import dataclass
from typing import Optional

import opentinker
from opentinker import EnvInfo, Message, PluginError, StepResult

WORDS = ["apple", "river", "stone", "cloud", "ember"]


@dataclass
class Config:
    """The environment's config (JSON); unknown fields are refused by name."""

    turns: int = 3


@opentinker.plugin
class Environment(opentinker.Environment):
    @classmethod
    def info(cls) -> EnvInfo:
        return EnvInfo(name="{name}", players=1, max_turns=8)

    @classmethod
    def generate_task(cls, config: str, seed: int) -> str:
        opentinker.parse_config(config, Config)
        return json.dumps({"word": opentinker.rng(seed).choice(WORDS)})

    def __init__(self, config: str, task: str, seed: int) -> None:
        self.config = opentinker.parse_config(config, Config)
        if not 1 <= self.config.turns <= 8:
            raise PluginError("config: `turns` must be in 1..=8")
        self.word = json.loads(task)["word"]
        self.turn = 0

    def observe(self, player: int) -> list[Message]:
        return [Message.user(f"Say the word `{self.word}`.")]

    def step(self, action: str) -> StepResult:
        self.turn += 1
        if self.word in action.lower():
            return StepResult.end([1.0]).metric("turn", self.turn)
        if self.turn == self.config.turns:
            return StepResult.end([0.0]).metric("turn", self.turn)
        return StepResult.next([0.0], 0).say(0, Message.user("No. Try again."))

    def legal_actions(self) -> Optional[list[str]]:
        return list(WORDS)

    def demonstration(self) -> Optional[str]:
        return self.word
"#;

const PYTHON_ENVIRONMENT_TEST: &str = r#""""The environment's rules, run natively (no component needed)."""

import app


def test_saying_the_word_wins_at_once():
    task = app.Environment.generate_task("{}", 1)
    episode = app.Environment("{}", task, 1)
    result = episode.step(episode.demonstration())
    assert result.rewards == [1.0] and result.next_player is None


def test_the_same_seed_gives_the_same_task():
    assert app.Environment.generate_task("{}", 5) == app.Environment.generate_task("{}", 5)
"#;

const PYTHON_AGENT: &str = r#""""{name}: an opentinker agent. It shows the policy the conversation so far with a system prompt
in front, and takes the first line of its completion as the action.

Test it: `python -m pytest tests`.
"""

import opentinker
from opentinker import Message


@opentinker.plugin
class Agent(opentinker.Agent):
    """The agent of one player in one episode (it keeps no state of its own)."""

    def prompt(self, history: list[Message]) -> list[Message]:
        return [Message.system("Answer with the action alone.")] + list(history)

    def act(self, completion: str) -> str:
        lines = completion.strip().splitlines()
        return lines[0].strip() if lines else ""
"#;

const PYTHON_AGENT_TEST: &str = r#""""The agent, run natively (no component needed)."""

import app
from opentinker import Message


def test_the_action_is_the_first_line():
    assert app.Agent("{}", 0, 0).act("  go north \nbecause") == "go north"


def test_the_prompt_starts_with_the_system_message():
    prompt = app.Agent("{}", 0, 0).prompt([Message.user("hi")])
    assert prompt[0].role == "system" and prompt[1] == Message.user("hi")
"#;

const PYTHON_REWARD: &str = r#""""{name}: an opentinker reward. It scores each player 1 when its last answer is short (at most
eight words), else 0: replace it with your own judgement of a finished episode.

Test it: `python -m pytest tests`.
"""

import opentinker
from opentinker import Transcript


@opentinker.plugin
class Reward(opentinker.Reward):
    @classmethod
    def score(cls, config: str, task: str, transcripts: list[Transcript]) -> list[float]:
        scores = []
        for transcript in transcripts:
            answers = [m.content for m in transcript.messages if m.role == "assistant"]
            short = bool(answers) and len(answers[-1].split()) <= 8
            scores.append(1.0 if short else 0.0)
        return scores
"#;

const PYTHON_REWARD_TEST: &str = r#""""The reward, run natively (no component needed)."""

import app
from opentinker import Message, Transcript


def test_a_short_last_answer_scores_one():
    transcript = Transcript(0, [Message.user("q"), Message.assistant("yes")])
    assert app.Reward.score("{}", "{}", [transcript]) == [1.0]


def test_no_answer_scores_zero():
    assert app.Reward.score("{}", "{}", [Transcript(0, [Message.user("q")])]) == [0.0]
"#;

const JS_ENVIRONMENT: &str = r#"// {name}: an opentinker environment. The policy is shown a word and must say it back.
//
// Replace the rules with your own; keep them deterministic (use `rng(seed)`, never the clock or
// Math.random), so that the same config, task, seed and actions give the same transcript.
//
// Build and play it: `opentinker plugin run .`; test it: `npm install && npm test`.

import {
  Environment,
  Message,
  PluginError,
  StepResult,
  configSchemaOf,
  parseConfig,
  plugin,
  rng,
} from "opentinker";

const WORDS = ["apple", "river", "stone", "cloud", "ember"];

/** The environment's config (JSON) and its defaults; unknown fields are refused by name. */
const DEFAULTS = { turns: 3 };

export class Word extends Environment {
  static configSchema = configSchemaOf(DEFAULTS);

  static info() {
    return { name: "{name}", players: 1, maxTurns: 8 };
  }

  static generateTask(config, seed) {
    parseConfig(config, DEFAULTS);
    return JSON.stringify({ word: rng(seed).choice(WORDS) });
  }

  constructor(config, task, seed) {
    super(config, task, seed);
    this.config = parseConfig(config, DEFAULTS);
    if (!Number.isInteger(this.config.turns) || this.config.turns < 1 || this.config.turns > 8) {
      throw new PluginError("config: `turns` must be an integer in 1..=8");
    }
    this.word = JSON.parse(task).word;
    if (!WORDS.includes(this.word)) {
      throw new PluginError(`unknown word ${JSON.stringify(this.word)}`);
    }
    this.turn = 0;
  }

  observe(player) {
    return [Message.user(`Say the word \`${this.word}\`.`)];
  }

  step(action) {
    this.turn += 1;
    if (action.toLowerCase().includes(this.word)) {
      return StepResult.end([1]).metric("turn", this.turn);
    }
    if (this.turn === this.config.turns) {
      return StepResult.end([0]).metric("turn", this.turn);
    }
    return StepResult.next([0], 0).say(0, Message.user("No. Try again."));
  }

  legalActions() {
    return [...WORDS];
  }

  demonstration() {
    return this.word;
  }
}

plugin(Word);
"#;

const JS_ENVIRONMENT_TEST: &str = r#"// The environment's rules, run natively by Node's test runner (no component needed).

import assert from "node:assert/strict";
import { test } from "node:test";
import { Word } from "../app.js";

test("saying the word wins at once", () => {
  const task = Word.generateTask("{}", 1);
  const episode = new Word("{}", task, 1);
  const result = episode.step(episode.demonstration());
  assert.deepEqual(result.rewards, [1]);
  assert.equal(result.nextPlayer, null);
});

test("the same seed gives the same task", () => {
  assert.equal(Word.generateTask("{}", 5), Word.generateTask("{}", 5));
});

test("an unknown config field is refused by name", () => {
  assert.throws(() => new Word('{"turn": 2}', Word.generateTask("{}", 1), 1), /`turn`/);
});
"#;

const JS_AGENT: &str = r#"// {name}: an opentinker agent. It shows the policy the conversation so far with a system prompt
// in front, and takes the first line of its completion as the action.
//
// Test it: `npm install && npm test`.

import { Agent, Message, plugin } from "opentinker";

/** The agent of one player in one episode (it keeps no state of its own). */
export class FirstLine extends Agent {
  prompt(history) {
    return [Message.system("Answer with the action alone."), ...history];
  }

  act(completion) {
    const lines = completion.trim().split("\n");
    return lines[0].trim();
  }
}

plugin(FirstLine);
"#;

const JS_AGENT_TEST: &str = r#"// The agent, run natively by Node's test runner (no component needed).

import assert from "node:assert/strict";
import { test } from "node:test";
import { Message } from "opentinker";
import { FirstLine } from "../app.js";

test("the action is the first line", () => {
  assert.equal(new FirstLine("{}", 0, 0).act("  go north \nbecause"), "go north");
});

test("the prompt starts with the system message", () => {
  const prompt = new FirstLine("{}", 0, 0).prompt([Message.user("hi")]);
  assert.equal(prompt[0].role, "system");
  assert.deepEqual(prompt[1], Message.user("hi"));
});
"#;

const JS_REWARD: &str = r#"// {name}: an opentinker reward. It scores each player 1 when its last answer is short (at most
// eight words), else 0: replace it with your own judgement of a finished episode.
//
// Test it: `npm install && npm test`.

import { Reward, plugin } from "opentinker";

export class ShortAnswer extends Reward {
  static score(config, task, transcripts) {
    return transcripts.map((transcript) => {
      const answers = transcript.messages.filter((m) => m.role === "assistant");
      const last = answers.at(-1);
      return last !== undefined && last.content.trim().split(/\s+/).length <= 8 ? 1 : 0;
    });
  }
}

plugin(ShortAnswer);
"#;

const JS_REWARD_TEST: &str = r#"// The reward, run natively by Node's test runner (no component needed).

import assert from "node:assert/strict";
import { test } from "node:test";
import { Message } from "opentinker";
import { ShortAnswer } from "../app.js";

test("a short last answer scores one", () => {
  const transcript = { player: 0, messages: [Message.user("q"), Message.assistant("yes")] };
  assert.deepEqual(ShortAnswer.score("{}", "{}", [transcript]), [1]);
});

test("no answer scores zero", () => {
  assert.deepEqual(ShortAnswer.score("{}", "{}", [{ player: 0, messages: [Message.user("q")] }]), [0]);
});
"#;

const RUST_ENVIRONMENT: &str = r#"//! {name}: an opentinker environment. The policy is shown a word and must say it back.
//!
//! Replace the rules with your own; keep them deterministic (use `SeededRng`, never the clock),
//! so that the same config, task, seed and actions give the same transcript.
//!
//! Build and play it: `opentinker plugin run .`; test it: `cargo test`.

use opentinker_sdk::{EnvInfo, Environment, Message, PluginError, SeededRng, StepResult};

const WORDS: [&str; 5] = ["apple", "river", "stone", "cloud", "ember"];
const TURNS: u32 = 3;

pub struct Word {
    word: String,
    turn: u32,
}

impl Environment for Word {
    fn info() -> EnvInfo {
        EnvInfo { name: "{name}".into(), players: 1, max_turns: TURNS }
    }

    fn generate_task(_config: &str, seed: u64) -> Result<String, PluginError> {
        let index = SeededRng::new(seed).range(0, WORDS.len() as i64 - 1) as usize;
        Ok(WORDS[index].to_string())
    }

    fn new(_config: &str, task: &str, _seed: u64) -> Result<Self, PluginError> {
        if !WORDS.contains(&task) {
            return Err(PluginError::new(format!("unknown word `{task}`")));
        }
        Ok(Word { word: task.to_string(), turn: 0 })
    }

    fn observe(&mut self, _player: u32) -> Result<Vec<Message>, PluginError> {
        Ok(vec![Message::user(format!("Say the word `{}`.", self.word))])
    }

    fn step(&mut self, action: &str) -> Result<StepResult, PluginError> {
        self.turn += 1;
        let turn = f64::from(self.turn);
        if action.to_lowercase().contains(&self.word) {
            return Ok(StepResult::end(vec![1.0]).metric("turn", turn));
        }
        if self.turn == TURNS {
            return Ok(StepResult::end(vec![0.0]).metric("turn", turn));
        }
        Ok(StepResult::next(vec![0.0], 0).say(0, Message::user("No. Try again.")))
    }

    fn legal_actions(&self) -> Option<Vec<String>> {
        Some(WORDS.iter().map(|w| w.to_string()).collect())
    }

    fn demonstration(&mut self) -> Option<String> {
        Some(self.word.clone())
    }
}

opentinker_sdk::export_environment!(Word);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saying_the_word_wins_at_once() {
        let task = Word::generate_task("{}", 1).unwrap();
        let mut episode = Word::new("{}", &task, 1).unwrap();
        let action = episode.demonstration().unwrap();
        let result = episode.step(&action).unwrap();
        assert_eq!((result.rewards, result.next_player), (vec![1.0], None));
    }
}
"#;

const RUST_AGENT: &str = r#"//! {name}: an opentinker agent. It shows the policy the conversation so far with a system prompt
//! in front, and takes the first line of its completion as the action.
//!
//! Test it: `cargo test`.

use opentinker_sdk::{Agent, Message, PluginError};

/// The agent of one player in one episode (it keeps no state of its own).
pub struct FirstLine;

impl Agent for FirstLine {
    fn new(_config: &str, _player: u32, _seed: u64) -> Result<Self, PluginError> {
        Ok(FirstLine)
    }

    fn prompt(&mut self, history: Vec<Message>) -> Result<Vec<Message>, PluginError> {
        let mut prompt = vec![Message::system("Answer with the action alone.")];
        prompt.extend(history);
        Ok(prompt)
    }

    fn act(&mut self, completion: &str) -> Result<String, PluginError> {
        Ok(completion.trim().lines().next().unwrap_or("").trim().to_string())
    }
}

opentinker_sdk::export_agent!(FirstLine);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_action_is_the_first_line() {
        let mut agent = FirstLine::new("{}", 0, 0).unwrap();
        assert_eq!(agent.act("  go north \nbecause").unwrap(), "go north");
    }
}
"#;

const RUST_REWARD: &str = r#"//! {name}: an opentinker reward. It scores each player 1 when its last answer is short (at most
//! eight words), else 0: replace it with your own judgement of a finished episode.
//!
//! Test it: `cargo test`.

use opentinker_sdk::{PluginError, Reward, Transcript};

pub struct ShortAnswers;

impl Reward for ShortAnswers {
    fn score(
        _config: &str,
        _task: &str,
        transcripts: &[Transcript],
    ) -> Result<Vec<f64>, PluginError> {
        Ok(transcripts
            .iter()
            .map(|t| {
                let last = t.messages.iter().rev().find(|m| m.role == "assistant");
                match last {
                    Some(m) if m.content.split_whitespace().count() <= 8 => 1.0,
                    _ => 0.0,
                }
            })
            .collect())
    }
}

opentinker_sdk::export_reward!(ShortAnswers);

#[cfg(test)]
mod tests {
    use super::*;
    use opentinker_sdk::Message;

    #[test]
    fn a_short_last_answer_scores_one() {
        let transcript = Transcript { player: 0, messages: vec![Message::assistant("yes")] };
        assert_eq!(ShortAnswers::score("{}", "", &[transcript]).unwrap(), vec![1.0]);
    }
}
"#;
