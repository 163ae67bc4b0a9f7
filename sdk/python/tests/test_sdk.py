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
