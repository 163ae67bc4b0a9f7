"""The environment's rules and its interpreter, run natively (no component needed)."""

import json

import app
import pytest
from opentinker import PluginError


def start(question: str, numbers: list[int], config: str = "{}") -> app.ListCode:
    return app.ListCode(config, json.dumps({"question": question, "numbers": numbers}), 0)


def test_the_right_program_solves_on_the_first_turn():
    for question, (_, program, _) in app.QUESTIONS.items():
        episode = start(question, [3, 8, 1, 5])
        result = episode.step(program)
        assert result.rewards == [1.0] and result.next_player is None, question


def test_a_statement_that_prints_is_an_answer_too():
    episode = start("sum", [3, 8, 1])
    assert episode.step("total = sum(xs); print(total)").rewards == [1.0]


def test_a_wrong_output_is_shown_and_the_second_try_earns_half():
    episode = start("max", [3, 8, 1])
    first = episode.step("min(xs)")
    assert first.next_player == 0 and first.messages[0][1][0].content == "Output: 1"
    assert episode.step("max(xs)").rewards == [0.5]


def test_the_program_reaches_no_file_nor_import():
    assert app.run_program("open('/etc/passwd')", []).startswith("Error: NameError")
    assert app.run_program("__import__('os')", []).startswith("Error: NameError")
    assert app.run_program("import os", []).startswith("Error: ImportError")


def test_a_program_error_is_an_observation_not_a_fault():
    episode = start("sum", [1, 2])
    result = episode.step("sum(")
    assert result.messages[0][1][0].content.startswith("Error: SyntaxError")
    assert [m.value for m in result.metrics if m.name == "error"] == [1.0]


def test_demonstrations_are_right_as_often_as_the_config_says():
    right = 0
    for seed in range(200):
        task = app.ListCode.generate_task("{}", seed)
        episode = app.ListCode("{}", task, seed)
        right += episode.step(episode.demonstration()).rewards == [1.0]
    assert 0.75 < right / 200 <= 0.95


def test_an_unsure_teacher_gives_the_confused_program_half_the_time():
    config = json.dumps({"questions": ["min", "sum"], "unsure": ["min"], "demonstrations": 1.0})
    programs = {"min": [], "sum": []}
    for seed in range(400):
        task = app.ListCode.generate_task(config, seed)
        episode = app.ListCode(config, task, seed)
        programs[episode.question].append(episode.demonstration())
    assert set(programs["sum"]) == {"sum(xs)"}
    confused = programs["min"].count("max(xs)") / len(programs["min"])
    assert set(programs["min"]) == {"min(xs)", "max(xs)"} and 0.4 < confused < 0.6


def test_a_bad_config_is_refused_by_name():
    with pytest.raises(PluginError, match="questions"):
        app.ListCode.generate_task('{"questions": ["product"]}', 0)
    with pytest.raises(PluginError, match="unknown config field `turn`"):
        app.ListCode.generate_task('{"turn": 3}', 0)
    with pytest.raises(PluginError, match="unsure"):
        app.ListCode.generate_task('{"unsure": ["product"]}', 0)
    with pytest.raises(PluginError, match="length"):
        app.ListCode.generate_task('{"length": [5, 2]}', 0)
