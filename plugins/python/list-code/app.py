"""List puzzles answered by code: a tool-use environment whose tool, a Python interpreter, runs
inside the same sandboxed component as the environment (no host call, no files, no network).

The task is a question about a short list of numbers, given to the program as the variable `xs`
("xs = [3, 8, 1]. Compute the sum of xs."). The policy's action is one line of Python, an
expression or statements that `print`; the environment runs it, with `xs` and only a few pure
builtins in reach, and shows the policy the output ("Output: 12") or the error ("Error: NameError:
name 'total' is not defined"). An output equal to the answer ends the episode
with reward 1 on the first turn, 0.5 on the second; after `turns` wrong outputs it ends with 0. A
program that never ends or that allocates without bound is stopped by the host's fuel and memory
limits: the episode ends with that typed error, and no other episode is touched.

Config (JSON): `{"turns": 2, "length": [3, 5], "questions": ["sum", "max", ...], "demonstrations":
0.8, "unsure": ["min"]}` (`length`: the shortest and longest list; `questions`: default all of
`QUESTIONS`; `demonstrations`: how often the demonstration is the right program; else a program for
another question, so that a warm-up is modest; `unsure`: questions on which the teacher is torn,
its demonstration half the time the program of the question it is taken for, `CONFUSED_WITH`:
a warm-up however long leaves the policy guessing there, which RL must settle).
Task (JSON): `{"question": "sum", "numbers": [3, 8, 1]}`.
"""

import builtins
import io
import json
from dataclasses import dataclass
from typing import Optional

import opentinker
from opentinker import EnvInfo, Message, PluginError, StepResult

#: Each question: its words, the program that answers it, and the answer.
QUESTIONS = {
    "sum": ("the sum of xs", "sum(xs)", sum),
    "max": ("the largest number in xs", "max(xs)", max),
    "min": ("the smallest number in xs", "min(xs)", min),
    "len": ("how many numbers xs has", "len(xs)", len),
    "sorted": ("xs sorted, smallest first", "sorted(xs)", sorted),
    "last": ("the last number in xs", "xs[-1]", lambda xs: xs[-1]),
    "spread": ("the largest minus the smallest number in xs", "max(xs) - min(xs)",
               lambda xs: max(xs) - min(xs)),
    "evens": ("how many even numbers xs has", "len([x for x in xs if x % 2 == 0])",
              lambda xs: len([x for x in xs if x % 2 == 0])),
}

#: The question each is most easily taken for: an unsure teacher's other answer.
CONFUSED_WITH = {
    "sum": "len", "len": "sum", "max": "min", "min": "max", "sorted": "sum", "last": "max",
    "spread": "max", "evens": "len",
}

#: What a program may call: pure functions of their arguments, nothing that reaches out.
SAFE_BUILTINS = {
    name: getattr(builtins, name)
    for name in (
        "abs", "all", "any", "bool", "dict", "enumerate", "filter", "float", "int", "len",
        "list", "map", "max", "min", "range", "reversed", "round", "set", "sorted", "str",
        "sum", "tuple", "zip",
    )
}

#: The most characters of output shown to the policy.
MAX_OUTPUT = 200


@dataclass
class Config:
    turns: int = 2
    length: list = None  # type: ignore[assignment]
    questions: list = None  # type: ignore[assignment]
    demonstrations: float = 0.8
    unsure: list = None  # type: ignore[assignment]


def parse_config(text: str) -> Config:
    config = opentinker.parse_config(text, Config)
    if config.questions is None:
        config.questions = list(QUESTIONS)
    if config.length is None:
        config.length = [3, 5]
    if config.unsure is None:
        config.unsure = []
    if not 1 <= config.turns <= 4:
        raise PluginError("list-code config: `turns` must be in 1..=4")
    if (
        len(config.length) != 2
        or not all(isinstance(n, int) for n in config.length)
        or not 1 <= config.length[0] <= config.length[1] <= 8
    ):
        raise PluginError("list-code config: `length` must be [shortest, longest] in 1..=8")
    unknown = [q for q in config.questions if q not in QUESTIONS]
    if not config.questions or unknown:
        raise PluginError(
            f"list-code config: `questions` must be a non-empty list of {', '.join(QUESTIONS)}"
        )
    if any(q not in QUESTIONS for q in config.unsure):
        raise PluginError(f"list-code config: `unsure` must be a list of {', '.join(QUESTIONS)}")
    if not 0.0 <= config.demonstrations <= 1.0:
        raise PluginError("list-code config: `demonstrations` must be in 0..=1")
    return config


def run_program(program: str, xs: list[int]) -> str:
    """Run one line of Python with `xs` defined: the value of an expression, or what statements
    print; an error is shown by its type and text. Runs in this component's interpreter, under
    the host's limits."""
    printed = io.StringIO()
    namespace = {
        "__builtins__": dict(SAFE_BUILTINS, print=lambda *a: builtins.print(*a, file=printed)),
        "xs": list(xs),
    }
    try:
        try:
            code = compile(program, "<policy>", "eval")
        except SyntaxError:
            code = compile(program, "<policy>", "exec")
            exec(code, namespace)
            output = printed.getvalue().strip()
        else:
            output = repr(eval(code, namespace))
    except MemoryError:
        raise
    except Exception as error:  # the policy's program failing is a normal observation
        return f"Error: {type(error).__name__}: {error}"[:MAX_OUTPUT]
    return output[:MAX_OUTPUT]


@opentinker.plugin
class ListCode(opentinker.Environment):
    config_schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "turns": {"type": "integer", "minimum": 1, "maximum": 4, "default": 2},
            "length": {
                "type": "array",
                "items": {"type": "integer", "minimum": 1, "maximum": 8},
                "minItems": 2,
                "maxItems": 2,
                "default": [3, 5],
            },
            "questions": {
                "type": "array",
                "minItems": 1,
                "items": {"enum": list(QUESTIONS)},
                "default": list(QUESTIONS),
            },
            "demonstrations": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.8},
            "unsure": {"type": "array", "items": {"enum": list(QUESTIONS)}, "default": []},
        },
    }

    @classmethod
    def info(cls) -> EnvInfo:
        return EnvInfo(name="list-code", players=1, max_turns=4)

    @classmethod
    def generate_task(cls, config: str, seed: int) -> str:
        parsed = parse_config(config)
        rng = opentinker.rng(seed)
        numbers = [rng.randint(0, 9) for _ in range(rng.randint(*parsed.length))]
        return json.dumps({"question": rng.choice(parsed.questions), "numbers": numbers})

    def __init__(self, config: str, task: str, seed: int) -> None:
        self.config = parse_config(config)
        try:
            parsed = json.loads(task)
            self.question = str(parsed["question"])
            self.numbers = [int(n) for n in parsed["numbers"]]
        except (ValueError, KeyError, TypeError) as error:
            raise PluginError(f"list-code task: {error!r}") from None
        if self.question not in QUESTIONS or not self.numbers:
            raise PluginError(f"list-code task: no question `{self.question}` of a non-empty list")
        self.answer = repr(QUESTIONS[self.question][2](self.numbers))
        self.turn = 0
        self.rng = opentinker.rng(seed ^ 0x11C0DE)

    def observe(self, player: int) -> list[Message]:
        words = QUESTIONS[self.question][0]
        return [
            Message.system("Answer with one line of Python. Its output is your answer."),
            Message.user(f"xs = {self.numbers}. Compute {words}."),
        ]

    def step(self, action: str) -> StepResult:
        self.turn += 1
        program = action.strip().splitlines()[0] if action.strip() else ""
        output = run_program(program, self.numbers) if program else "Error: no program"
        solved = output == self.answer
        if solved:
            reward = 1.0 if self.turn == 1 else 0.5
            result = StepResult.end([reward])
        elif self.turn >= self.config.turns:
            result = StepResult.end([0.0])
        else:
            result = StepResult.next([0.0], 0)
        shown = output if output.startswith("Error:") else f"Output: {output}"
        return (
            result.say(0, Message.user(shown))
            .metric("correct", 1.0 if solved else 0.0)
            .metric("error", 1.0 if output.startswith("Error:") else 0.0)
        )

    def demonstration(self) -> Optional[str]:
        question = self.question
        if question in self.config.unsure and self.rng.random() < 0.5:
            return QUESTIONS[CONFUSED_WITH[question]][1]
        if self.rng.random() >= self.config.demonstrations:
            question = self.rng.choice(list(QUESTIONS))
        return QUESTIONS[question][1]
