"""Write opentinker plugins in Python.

An opentinker plugin is a WebAssembly component that the host runs sandboxed: an `Environment`
(a game, a tool task, a math problem), an `Agent` (how a policy's text becomes an action), a
`Reward` function, a training `Objective` (a loss and its gradient by each logprob) or an
`Advantage` estimator. Subclass the matching base class and mark it with `@opentinker.plugin`; the
WIT bindings stay behind this package. `opentinker plugin build DIR` builds the component with
componentize-py (a pinned version it installs outside the project).

A complete environment, a coin the policy must call::

    import opentinker
    from opentinker import EnvInfo, Message, StepResult

    @opentinker.plugin
    class CallTheCoin(opentinker.Environment):
        @classmethod
        def info(cls) -> EnvInfo:
            return EnvInfo(name="call-the-coin", players=1, max_turns=1)

        def __init__(self, config: str, task: str, seed: int):
            self.heads = seed % 2 == 0

        def observe(self, player: int) -> list[Message]:
            return [Message.user("I flipped a coin. Answer `heads` or `tails`.")]

        def step(self, action: str) -> StepResult:
            called_heads = action.strip().lower() == "heads"
            return StepResult.end([1.0 if called_heads == self.heads else 0.0])

The rules are the Rust SDK's: the same config, task, seed and actions give the same transcript
(use `rng(seed)`, never the clock); an illegal action is a normal result (a penalty, metric
`invalid_action`), and an exception is the plugin's own fault, which ends only its episode.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Optional, TypeVar

__all__ = [
    "Advantage",
    "Agent",
    "DatumLoss",
    "EnvInfo",
    "Environment",
    "LogLevel",
    "Message",
    "Metric",
    "Objective",
    "ObjectiveDatum",
    "PluginError",
    "Reward",
    "StepResult",
    "Tensor",
    "Transcript",
    "config_schema_of",
    "log",
    "parse_config",
    "plugin",
    "rng",
]


class PluginError(Exception):
    """A fault of the plugin itself: a bad config, a task it cannot parse, a broken invariant.

    Any other exception a plugin raises is reported the same way, with its type and text.
    """


@dataclass(frozen=True)
class Message:
    """One chat message: `role` is `system`, `user`, `assistant` or `tool`."""

    role: str
    content: str

    @staticmethod
    def system(content: str) -> "Message":
        return Message("system", content)

    @staticmethod
    def user(content: str) -> "Message":
        return Message("user", content)

    @staticmethod
    def assistant(content: str) -> "Message":
        return Message("assistant", content)


@dataclass(frozen=True)
class Metric:
    """A named number, reported for logging only (it never changes training)."""

    name: str
    value: float


@dataclass(frozen=True)
class EnvInfo:
    """The environment's name, number of players and turn limit (0: none of its own)."""

    name: str
    players: int = 1
    max_turns: int = 0


@dataclass(frozen=True)
class Transcript:
    """What one player of a finished episode saw (`user`) and did (`assistant`)."""

    player: int
    messages: list[Message]


@dataclass
class StepResult:
    """What one call of `Environment.step` returns."""

    rewards: list[float]
    next_player: Optional[int] = None
    messages: list[tuple[int, list[Message]]] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)

    @staticmethod
    def next(rewards: list[float], next_player: int) -> "StepResult":
        """The episode goes on; `next_player` acts next."""
        return StepResult(list(rewards), next_player)

    @staticmethod
    def end(rewards: list[float]) -> "StepResult":
        """The episode ends with this step."""
        return StepResult(list(rewards), None)

    def say(self, player: int, message: Message) -> "StepResult":
        """Show `message` to `player` (it reaches the policy with its next turn)."""
        for to, messages in self.messages:
            if to == player:
                messages.append(message)
                return self
        self.messages.append((player, [message]))
        return self

    def metric(self, name: str, value: float) -> "StepResult":
        """Report a named number for this step. The host adds up each metric over the
        episode's steps: report a count's increments, or a total once, on the last step."""
        self.metrics.append(Metric(name, float(value)))
        return self


class Environment:
    """A task environment. The host makes one value per episode with `__init__(config, task,
    seed)`, asks each player what it sees with `observe`, then calls `step` with the action of the
    player to move until a step says no one moves next."""

    @classmethod
    def info(cls) -> EnvInfo:
        """The environment's name, number of players and turn limit."""
        raise NotImplementedError

    @classmethod
    def generate_task(cls, config: str, seed: int) -> str:
        """Make a task for a data-free environment; the same config and seed give the same task."""
        raise PluginError("this environment does not generate tasks: give the job a task dataset")

    #: The JSON Schema of the config `__init__` takes (a dict; see `config_schema_of`), shown in
    #: the component's metadata and checked against a job's config before any work. `None`:
    #: the environment declares none.
    config_schema: ClassVar[Optional[dict[str, Any]]] = None

    def __init__(self, config: str, task: str, seed: int) -> None:
        """Start an episode. An exception here (a bad config or task) refuses it."""

    def observe(self, player: int) -> list[Message]:
        """What `player` sees before its first action."""
        raise NotImplementedError

    def step(self, action: str) -> StepResult:
        """Apply the action of the player to move."""
        raise NotImplementedError

    def legal_actions(self) -> Optional[list[str]]:
        """The legal actions of the player to move, if the environment can list them."""
        return None

    def demonstration(self) -> Optional[str]:
        """A legal, ideally good, action for the player to move."""
        return None


class Agent:
    """How a policy talks to an environment: what it is shown, and how its text becomes an action.
    The host makes one value per player per episode with `__init__(config, player, seed)`, so an
    agent may keep state from turn to turn."""

    #: The JSON Schema of the config `__init__` takes; `None`: none declared.
    config_schema: ClassVar[Optional[dict[str, Any]]] = None

    def __init__(self, config: str, player: int, seed: int) -> None:
        """Start the agent of `player` (the job's `[agent] config`, JSON). An exception here
        ends the episode."""

    def prompt(self, history: list[Message]) -> list[Message]:
        """The chat messages the policy sees, given the conversation so far."""
        return list(history)

    def act(self, completion: str) -> str:
        """Parse a sampled completion into an action."""
        return completion


class Reward:
    """A reward function over finished episodes."""

    #: The JSON Schema of the config the scorers take; `None`: none declared.
    config_schema: ClassVar[Optional[dict[str, Any]]] = None

    @classmethod
    def score(cls, config: str, task: str, transcripts: list[Transcript]) -> list[float]:
        """One score per player of a finished episode of `task`, under `config` (the job's
        `[reward] config`, JSON)."""
        raise NotImplementedError

    @classmethod
    def score_group(
        cls, config: str, task: str, episodes: list[list[Transcript]]
    ) -> Optional[list[list[float]]]:
        """Scores for a group of episodes of one task, one list per episode; `None` (the
        default) when the reward has no group scorer."""
        return None


@dataclass(frozen=True)
class Tensor:
    """A named input of one datum, flattened row-major: `mask` (1 where a target token counts),
    `weights`, `advantages`, `logprobs` (the sampler's), or a name the datum's `loss_fn_inputs`
    gave it."""

    name: str
    shape: list[int]
    values: list[float]


@dataclass(frozen=True)
class ObjectiveDatum:
    """What an objective sees of one datum: the policy's logprob of each target token (what the
    loss is differentiated by) and the datum's other inputs."""

    logprobs: list[float]
    inputs: list[Tensor]

    def input(self, name: str) -> Optional[list[float]]:
        """The values of the input `name`, if the datum has it."""
        for tensor in self.inputs:
            if tensor.name == name:
                return tensor.values
        return None

    def require(self, name: str) -> list[float]:
        """The values of the input `name`, or a `PluginError` that names it."""
        values = self.input(name)
        if values is None:
            raise PluginError(f"the datum has no input {name!r}")
        return values


@dataclass
class DatumLoss:
    """The loss on one datum: its value, its derivative with respect to each of the datum's
    logprobs (as many values), and metrics (added over the call's datums; a name ending in
    `:mean` is averaged instead)."""

    value: float
    gradient: list[float]
    metrics: list[Metric] = field(default_factory=list)


class Objective:
    """A training objective: the loss of a `forward_backward` call or of an RL job's steps. The
    engine computes the policy's logprobs, calls `loss` for each datum, and back-propagates the
    returned gradient through the model in the same pass as its built-in losses. A datum's loss
    must depend on that datum alone (a call's datums may come in several batches)."""

    #: The JSON Schema of the config `loss` takes; `None`: none declared.
    config_schema: ClassVar[Optional[dict[str, Any]]] = None

    @classmethod
    def loss(cls, config: str, datum: ObjectiveDatum) -> DatumLoss:
        """The loss of `datum` under `config` (JSON; `{}` when absent) and its gradient."""
        raise NotImplementedError


class Advantage:
    """An advantage estimator: how a group of episodes of one task turns the rewards of their
    turns into each turn's advantage (the host's default is GRPO's `R - mean(R)`)."""

    #: The JSON Schema of the config `advantages` takes; `None`: none declared.
    config_schema: ClassVar[Optional[dict[str, Any]]] = None

    @classmethod
    def advantages(cls, config: str, group: list[list[float]]) -> list[list[float]]:
        """Per episode of `group` (each given as its turns' rewards), the advantage of each turn,
        as many as it has rewards, under `config` (JSON; `{}` when absent)."""
        raise NotImplementedError


_KINDS = {
    "environment": Environment,
    "agent": Agent,
    "reward": Reward,
    "objective": Objective,
    "advantage": Advantage,
}
_registered: dict[str, type] = {}


def plugin(cls: type) -> type:
    """Mark `cls` (a subclass of `Environment`, `Agent`, `Reward`, `Objective` or `Advantage`) as
    this component's plugin of its kind."""
    for kind, base in _KINDS.items():
        if isinstance(cls, type) and issubclass(cls, base):
            if kind in _registered and _registered[kind] is not cls:
                raise TypeError(
                    f"two {kind} plugins: {_registered[kind].__name__} and {cls.__name__}"
                )
            _registered[kind] = cls
            return cls
    raise TypeError(
        f"{cls!r} is not a subclass of Environment, Agent, Reward, Objective or Advantage"
    )


def registered(kind: str) -> type:
    """The class marked with `@plugin` for `kind` (used by the component's glue)."""
    try:
        return _registered[kind]
    except KeyError:
        raise PluginError(f"no {kind} class is marked with @opentinker.plugin") from None


class LogLevel(Enum):
    TRACE = "trace"
    DEBUG = "debug"
    INFO = "info"
    WARN = "warn"
    ERROR = "error"


def log(level: LogLevel, message: str) -> None:
    """Append a line to the episode's log, kept by the host within a byte budget. Outside a
    component (unit tests) the line goes to stderr."""
    try:
        from wit_world.imports import host  # type: ignore[import-not-found]
    except ImportError:
        print(f"[{level.value}] {message}", file=sys.stderr)
        return
    host.log(getattr(host.LogLevel, level.name), message)


def rng(seed: int) -> random.Random:
    """A random generator for `seed`: the same seed gives the same numbers everywhere."""
    return random.Random(seed)


T = TypeVar("T")


def parse_config(config: str, schema: type[T]) -> T:
    """Parse a JSON config into the dataclass `schema`: missing fields take their defaults, and an
    unknown field or a value of the wrong type is a `PluginError` naming it."""
    try:
        raw: Any = json.loads(config) if config.strip() else {}
    except json.JSONDecodeError as error:
        raise PluginError(f"the config is not JSON: {error}") from None
    if not isinstance(raw, dict):
        raise PluginError(f"the config must be a JSON object, not {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(schema)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise PluginError(
            f"unknown config field `{unknown[0]}` (known: {', '.join(sorted(fields))})"
        )
    for name, value in raw.items():
        expected = fields[name].type
        expected = {"int": int, "float": float, "str": str, "bool": bool}.get(
            expected if isinstance(expected, str) else getattr(expected, "__name__", ""), None
        )
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            raw[name] = float(value)
        elif expected is not None and (
            not isinstance(value, expected) or (expected is int and isinstance(value, bool))
        ):
            raise PluginError(
                f"config field `{name}` must be {expected.__name__}, not {type(value).__name__}"
            )
    return schema(**raw)


_JSON_TYPES = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}


def config_schema_of(schema: type) -> dict[str, Any]:
    """The JSON Schema of the config `parse_config(text, schema)` accepts: an object of the
    dataclass's fields (each typed when it is an `int`, `float`, `str` or `bool`, with its default)
    and no others. Set it as a plugin's `config_schema`."""
    properties: dict[str, Any] = {}
    for f in dataclasses.fields(schema):  # type: ignore[arg-type]
        name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        prop: dict[str, Any] = {}
        if name in _JSON_TYPES:
            prop["type"] = _JSON_TYPES[name]
        if f.default is not dataclasses.MISSING:
            prop["default"] = f.default
        properties[f.name] = prop
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }
