"""The Python SDK outside a component: its types, its config parsing and its plugin marking."""

from dataclasses import dataclass

import pytest

import opentinker
from opentinker import EnvInfo, Message, PluginError, StepResult


@dataclass
class Config:
    size: int = 3
    rate: float = 0.5
    name: str = "x"
    strict: bool = False


def test_a_config_takes_defaults_and_converts_whole_numbers_to_floats():
    config = opentinker.parse_config('{"size": 5, "rate": 1}', Config)
    assert config == Config(size=5, rate=1.0)
    assert isinstance(config.rate, float)
    assert opentinker.parse_config("", Config) == Config()


@pytest.mark.parametrize(
    "text, named",
    [
        ('{"sise": 5}', "sise"),
        ('{"size": "5"}', "size"),
        ('{"size": true}', "size"),
        ('{"strict": 1}', "strict"),
        ("[1]", "JSON object"),
        ("{", "not JSON"),
    ],
)
def test_a_bad_config_is_a_plugin_error_naming_the_problem(text, named):
    with pytest.raises(PluginError, match=named):
        opentinker.parse_config(text, Config)


def test_step_results_gather_messages_per_player_and_metrics():
    result = (
        StepResult.next([0.0, 1.0], 1)
        .say(1, Message.user("a"))
        .say(0, Message.user("b"))
        .say(1, Message.user("c"))
        .metric("invalid_action", 0)
    )
    assert result.messages == [(1, [Message.user("a"), Message.user("c")]), (0, [Message.user("b")])]
    assert result.metrics == [opentinker.Metric("invalid_action", 0.0)]
    assert StepResult.end([1.0]).next_player is None


def test_the_same_seed_gives_the_same_numbers():
    assert [opentinker.rng(3).random() for _ in range(2)] == [opentinker.rng(3).random()] * 2
    assert opentinker.rng(3).random() != opentinker.rng(4).random()


def test_one_class_per_kind_is_marked_and_other_classes_are_refused(monkeypatch):
    monkeypatch.setattr(opentinker, "_registered", {})

    @opentinker.plugin
    class Coin(opentinker.Environment):
        @classmethod
        def info(cls):
            return EnvInfo("coin")

    assert opentinker.registered("environment") is Coin
    with pytest.raises(TypeError, match="two environment plugins"):

        @opentinker.plugin
        class Other(opentinker.Environment):
            pass

    with pytest.raises(TypeError, match="not a subclass"):
        opentinker.plugin(int)


def test_log_outside_a_component_goes_to_stderr(capsys):
    opentinker.log(opentinker.LogLevel.WARN, "careful")
    assert capsys.readouterr().err == "[warn] careful\n"


def test_a_config_schema_names_each_field_with_its_type_and_default_and_no_others():
    schema = opentinker.config_schema_of(Config)
    assert schema["additionalProperties"] is False
    assert schema["properties"] == {
        "size": {"type": "integer", "default": 3},
        "rate": {"type": "number", "default": 0.5},
        "name": {"type": "string", "default": "x"},
        "strict": {"type": "boolean", "default": False},
    }


def test_an_agent_is_made_per_player_and_keeps_its_state():
    class Counting(opentinker.Agent):
        def __init__(self, config: str, player: int, seed: int) -> None:
            self.player, self.turns = player, 0

        def prompt(self, history: list[Message]) -> list[Message]:
            self.turns += 1
            return [Message.user(f"player {self.player}, turn {self.turns}")]

    agent = Counting("{}", 1, 7)
    agent.prompt([])
    assert agent.prompt([]) == [Message.user("player 1, turn 2")]
    assert agent.act(" 3 ") == " 3 "
    assert opentinker.Agent("{}", 0, 0).prompt([Message.user("hi")]) == [Message.user("hi")]


def test_a_reward_is_given_its_config():
    class Weighted(opentinker.Reward):
        @classmethod
        def score(cls, config, task, transcripts):
            weight = opentinker.parse_config(config, WeightConfig).weight
            return [weight for _ in transcripts]

    transcript = opentinker.Transcript(0, [Message.assistant("x")])
    assert Weighted.score('{"weight": 2.5}', "{}", [transcript]) == [2.5]
    assert Weighted.score_group("{}", "{}", [[transcript]]) is None


@dataclass
class WeightConfig:
    weight: float = 1.0


def test_objectives_and_estimators_are_kinds_of_their_own(monkeypatch):
    monkeypatch.setattr(opentinker, "_registered", {})

    @opentinker.plugin
    class Loss(opentinker.Objective):
        @classmethod
        def loss(cls, config, datum):
            mask = datum.require("mask")
            return opentinker.DatumLoss(-sum(datum.logprobs), [-m for m in mask])

    @opentinker.plugin
    class Centred(opentinker.Advantage):
        @classmethod
        def advantages(cls, config, group):
            mean = sum(sum(e) for e in group) / len(group)
            return [[r - mean / len(e) for r in e] for e in group]

    assert opentinker.registered("objective") is Loss
    assert opentinker.registered("advantage") is Centred
    datum = opentinker.ObjectiveDatum(
        [-1.0, -2.0], [opentinker.Tensor("mask", [2], [1.0, 0.0])]
    )
    loss = Loss.loss("{}", datum)
    assert loss.value == 3.0 and loss.gradient == [-1.0, -0.0] and loss.metrics == []
    assert datum.input("weights") is None
    with pytest.raises(PluginError, match="'advantages'"):
        datum.require("advantages")
    assert Centred.advantages("{}", [[1.0], [3.0]]) == [[-1.0], [1.0]]
