"""The environment's rules, run natively by pytest (no component needed)."""

import json

import pytest

import app
from opentinker import PluginError


def test_binary_search_demonstrations_find_every_secret_within_seven_turns():
    for secret in range(1, 101):
        episode = app.GuessNumber("{}", json.dumps({"secret": secret}), 0)
        for _ in range(7):
            result = episode.step(episode.demonstration())
            if result.next_player is None:
                break
        assert result.rewards[0] > 0, secret


def test_a_reply_without_a_number_is_an_invalid_action_that_costs_a_turn():
    episode = app.GuessNumber("{}", '{"secret": 5}', 0)
    result = episode.step("no idea")
    assert result.next_player == 0
    assert ("invalid_action", 1.0) in [(m.name, m.value) for m in result.metrics]


def test_the_same_seed_gives_the_same_task():
    assert app.GuessNumber.generate_task("{}", 7) == app.GuessNumber.generate_task("{}", 7)


def test_an_unknown_config_field_is_named():
    with pytest.raises(PluginError, match="maxx"):
        app.GuessNumber.generate_task('{"maxx": 5}', 0)
