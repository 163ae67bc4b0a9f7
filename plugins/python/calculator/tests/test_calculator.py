"""The environment's rules and its calculator, run natively by pytest (no component needed)."""

import json

import pytest

import app
from opentinker import PluginError


def metrics(result):
    return {m.name: m.value for m in result.metrics}


def test_generated_answers_are_right_and_reproducible():
    kinds = set()
    for seed in range(300):
        text = app.Calculator.generate_task("{}", seed)
        assert text == app.Calculator.generate_task("{}", seed)
        task = json.loads(text)
        question, answer = task["question"], task["answer"]
        numbers = [int(n) for n in app.re.findall(r"\d+", question)]
        if "in each bag" in question:
            a, b = numbers
            expected = a * b
        elif "shares them equally" in question:
            total, c, b, _ = numbers
            assert total % c == 0, task
            expected = total // c + b
        else:
            a, b, c = numbers
            expected = a * b - c
        kinds.add(question.split()[1])
        assert answer == expected and answer >= 0, task
        assert app.calculate(task["expression"]) == answer, task
    assert len(kinds) >= 3


def test_a_call_answers_with_its_result_and_the_answer_ends_the_episode():
    episode = app.Calculator("{}", '{"question": "q", "answer": 888}', 0)
    result = episode.step("Let me compute. <calc>37 * 24</calc>")
    assert result.next_player == 0
    assert result.messages[0][1][0].content == "Result: 888"
    # The host adds each metric up over the steps: a call counts on its own step.
    assert metrics(result) == {"calls": 1, "bad_calls": 0}
    result = episode.step("So the answer is 888.")
    assert result.next_player is None
    assert result.rewards == [1.0]
    assert metrics(result) == {"calls": 0, "bad_calls": 0, "correct": 1.0}


def test_a_wrong_answer_scores_zero_and_the_last_turn_is_the_answer():
    episode = app.Calculator('{"turns": 2}', '{"question": "q", "answer": 888}', 0)
    assert metrics(episode.step("<calc>37 * 24</calc>"))["calls"] == 1
    result = episode.step("<calc>1 + 1</calc> it is 887")
    assert result.next_player is None
    assert result.rewards == [0.0]
    # The last turn's call is the answer, not a call.
    assert metrics(result)["calls"] == 0


def test_the_demonstration_calls_the_calculator_then_answers_with_its_result():
    task = app.Calculator.generate_task("{}", 7)
    episode = app.Calculator("{}", task, 7)
    call = episode.demonstration()
    assert app.CALL.fullmatch(call), call
    result = episode.step(call)
    assert result.next_player == 0
    answer = episode.demonstration()
    assert "<calc>" not in answer
    result = episode.step(answer)
    assert result.rewards == [1.0] and metrics(result)["correct"] == 1
    # With one turn there is no room to call: the demonstration answers at once.
    one_turn = app.Calculator('{"turns": 1}', task, 7)
    assert one_turn.step(one_turn.demonstration()).rewards == [1.0]


def test_the_calculator_reads_arithmetic_and_nothing_else():
    assert app.calculate("(12 + 3) * 4 - 6 / 3") == 58
    assert app.calculate("-5 × 2") == -10
    assert app.shown(app.calculate("7 / 2")) == "3.5"
    assert app.shown(app.calculate("8 / 2")) == "4"
    for bad in ["__import__('os')", "2 ** 999999", "x + 1", "1 / 0", "1 +", "9" * 300]:
        with pytest.raises(ValueError):
            app.calculate(bad)


def test_a_call_that_does_not_evaluate_says_why_and_counts():
    episode = app.Calculator("{}", '{"question": "q", "answer": 4}', 0)
    result = episode.step("<calc>two plus two</calc>")
    assert result.messages[0][1][0].content.startswith("Result: error")
    assert metrics(result) == {"calls": 1, "bad_calls": 1}


def test_bad_config_and_task_are_named():
    with pytest.raises(PluginError, match="turns"):
        app.Calculator.generate_task('{"turns": 0}', 0)
    with pytest.raises(PluginError, match="max_operand"):
        app.Calculator.generate_task('{"max_operand": 5}', 0)
    with pytest.raises(PluginError, match="calculator task"):
        app.Calculator("{}", "not json", 0)
