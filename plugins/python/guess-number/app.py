"""Guess the number: a secret in 1..max; each guess is answered "higher" or "lower" until the
policy finds it or runs out of turns. Finding it on turn t of T gives reward (T - t + 1) / T; running
out gives 0. A reply with no number is an invalid action: it costs a turn and is told so. The
rules of `plugins/guess-number`, on the Python SDK.

Config (JSON): `{"max": 100, "turns": 10, "demonstrations": "binary", "split": 0.5}`.
Task (JSON): `{"secret": 37}`.
"""

import json
import re
from dataclasses import dataclass
from typing import Optional

import opentinker
from opentinker import EnvInfo, Message, PluginError, StepResult

#: The most turns any config may allow (`info().max_turns`).
MAX_TURNS = 32


@dataclass
class Config:
    max: int = 100
    turns: int = 10
    demonstrations: str = "binary"
    split: float = 0.5
    show_range: bool = False


def parse_config(text: str) -> Config:
    config = opentinker.parse_config(text, Config)
    if config.max < 2:
        raise PluginError("guess-number config: `max` must be at least 2")
    if not 0.0 <= config.split <= 1.0:
        raise PluginError("guess-number config: `split` must be in 0..=1")
    if not 1 <= config.turns <= MAX_TURNS:
        raise PluginError(f"guess-number config: `turns` must be in 1..={MAX_TURNS}")
    if config.demonstrations not in ("binary", "random"):
        raise PluginError("guess-number config: `demonstrations` must be `binary` or `random`")
    return config


def last_number(text: str) -> Optional[int]:
    """The last whole number in `text`, if any."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text)
    if not numbers:
        return None
    value = float(numbers[-1])
    return int(value) if value.is_integer() and value >= 0 else None


@opentinker.plugin
class GuessNumber(opentinker.Environment):
    config_schema = opentinker.config_schema_of(Config)

    @classmethod
    def info(cls) -> EnvInfo:
        return EnvInfo(name="guess-number-py", players=1, max_turns=MAX_TURNS)

    @classmethod
    def generate_task(cls, config: str, seed: int) -> str:
        parsed = parse_config(config)
        return json.dumps({"secret": opentinker.rng(seed).randint(1, parsed.max)})

    def __init__(self, config: str, task: str, seed: int) -> None:
        self.config = parse_config(config)
        try:
            self.secret = int(json.loads(task)["secret"])
        except (ValueError, KeyError, TypeError) as error:
            raise PluginError(f"guess-number task: {error!r}") from None
        if not 1 <= self.secret <= self.config.max:
            raise PluginError(
                f"guess-number task: secret {self.secret} is outside 1..={self.config.max}"
            )
        self.turn = 0
        self.low, self.high = 1, self.config.max
        # Not the task's own stream: the first random guess would then be the secret.
        self.rng = opentinker.rng(seed ^ 0xD3E05EED00000001)

    def observe(self, player: int) -> list[Message]:
        return [
            Message.system("Find the secret number. Reply with one number per turn."),
            Message.user(
                f"I am thinking of a number from 1 to {self.config.max}. "
                f"You have {self.config.turns} guesses. Your guess?"
            ),
        ]

    def step(self, action: str) -> StepResult:
        self.turn += 1
        turns_left = self.config.turns - self.turn
        guess = last_number(action)
        if guess is None:
            return self._metrics(self._continue_or_end("That is not a number.", turns_left), True)
        if guess == self.secret:
            total = self.config.turns
            reward = (total - self.turn + 1) / total
            result = StepResult.end([reward]).say(0, Message.user(f"Yes, it is {guess}!"))
            return self._metrics(result.metric("found", 1.0), False)
        if guess < self.secret:
            self.low = max(self.low, guess + 1)
            hint = "Higher."
        else:
            self.high = min(self.high, max(guess - 1, 0))
            hint = "Lower."
        return self._metrics(self._continue_or_end(hint, turns_left), False)

    def demonstration(self) -> Optional[str]:
        if self.config.demonstrations == "binary":
            return str(self.low + int((self.high - self.low) * self.config.split))
        return str(self.rng.randint(self.low, self.high))

    def _metrics(self, result: StepResult, invalid: bool) -> StepResult:
        return result.metric("invalid_action", 1.0 if invalid else 0.0)

    def _continue_or_end(self, hint: str, turns_left: int) -> StepResult:
        if turns_left == 0:
            message = Message.user(f"{hint} No guesses left: it was {self.secret}.")
            return StepResult.end([0.0]).say(0, message).metric("found", 0.0)
        shown = f" It is from {self.low} to {self.high}." if self.config.show_range else ""
        return StepResult.next([0.0], 0).say(
            0, Message.user(f"{hint}{shown} {turns_left} guesses left. Your guess?")
        )
