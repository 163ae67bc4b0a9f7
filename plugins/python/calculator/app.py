"""Tool use: a word problem whose numbers are too large to work out in one's head, and a
calculator. The agent may call it by writing `<calc>EXPRESSION</calc>` (numbers, `+ - * /` and
parentheses); the result comes back as the next message, and the agent goes on. A reply without
a call is the answer: reward 1 when its last number is the problem's answer, else 0. The last
turn's reply is the answer whatever it holds. The calculator runs inside the plugin.

Config (JSON): `{"max_operand": 99, "turns": 3}`.
Task (JSON): `{"question": "...", "answer": 888, "expression": "37 * 24"}` (the expression that
solves it; the demonstration calls the calculator with it, then answers with its result).
Metrics: `correct`, `calls` (calculator calls made), `bad_calls` (calls that did not evaluate).
"""

import ast
import json
import operator
import re
from dataclasses import dataclass
from typing import Optional

import opentinker
from opentinker import EnvInfo, Message, PluginError, StepResult

#: The most turns any config may allow (`info().max_turns`).
MAX_TURNS = 8
#: The longest expression the calculator reads.
MAX_EXPRESSION = 200

INSTRUCTIONS = (
    "You can use a calculator: write <calc>EXPRESSION</calc>, for example <calc>12 * 34</calc>, "
    "and its result comes back. When you know the answer, end your reply with it as a number."
)
CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)

NAMES = ["Tom", "Sara", "Ali", "Mia", "Ben", "Lena", "Omar", "Emma", "Ravi", "Zoe"]
ITEMS = ["apples", "pencils", "marbles", "stickers", "cookies", "books", "shells", "cards"]


@dataclass
class Config:
    max_operand: int = 99
    turns: int = 3


def parse_config(text: str) -> Config:
    config = opentinker.parse_config(text, Config)
    if not 10 <= config.max_operand <= 1_000_000:
        raise PluginError("calculator config: `max_operand` must be in 10..=1000000")
    if not 1 <= config.turns <= MAX_TURNS:
        raise PluginError(f"calculator config: `turns` must be in 1..={MAX_TURNS}")
    return config


def generate(config: Config, seed: int) -> dict:
    """A problem of two or three numbers from `seed`."""
    rng = opentinker.rng(seed)
    name, items = rng.choice(NAMES), rng.choice(ITEMS)
    low = max(10, config.max_operand // 10)
    a, b = rng.randint(low, config.max_operand), rng.randint(low, config.max_operand)
    kind = rng.randint(0, 2)
    if kind == 0:
        question = f"{name} buys {a} bags with {b} {items} in each bag. How many {items} is that?"
        answer, expression = a * b, f"{a} * {b}"
    elif kind == 1:
        c = rng.randint(2, 9)
        question = (
            f"{name} has {a * c} {items} and shares them equally among {c} friends, then gets "
            f"{b} more. How many {items} does each friend get, plus {b}?"
        )
        answer, expression = a + b, f"{a * c} / {c} + {b}"
    else:
        c = rng.randint(1, a * b - 1)
        question = (
            f"There are {a} boxes with {b} {items} in each box. {name} takes {c} {items} away. "
            f"How many {items} are left?"
        )
        answer, expression = a * b - c, f"{a} * {b} - {c}"
    return {"question": question, "answer": answer, "expression": expression}


_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def calculate(expression: str) -> float:
    """The value of `expression`: numbers, `+ - * /`, unary minus and parentheses, nothing
    else (no names, no calls, no powers: an untrusted reply cannot make it run long)."""
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip().replace("×", "*").replace("÷", "/"), mode="eval")
    except SyntaxError:
        raise ValueError("not an arithmetic expression") from None

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ValueError("division by zero")
            return _OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = value(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        raise ValueError("only numbers, + - * / and parentheses")

    return value(tree.body)


def shown(number: float) -> str:
    """A result as the agent reads it: whole numbers without a point."""
    return str(int(number)) if float(number).is_integer() else f"{number:.6g}"


def last_number(text: str) -> Optional[float]:
    """The last number in `text`, if any."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
    return float(numbers[-1]) if numbers else None


@opentinker.plugin
class Calculator(opentinker.Environment):
    config_schema = opentinker.config_schema_of(Config)

    @classmethod
    def info(cls) -> EnvInfo:
        return EnvInfo(name="calculator-py", players=1, max_turns=MAX_TURNS)

    @classmethod
    def generate_task(cls, config: str, seed: int) -> str:
        return json.dumps(generate(parse_config(config), seed))

    def __init__(self, config: str, task: str, seed: int) -> None:
        self.config = parse_config(config)
        try:
            parsed = json.loads(task)
            self.question, self.answer = str(parsed["question"]), int(parsed["answer"])
            self.expression = parsed.get("expression")
        except (ValueError, KeyError, TypeError) as error:
            raise PluginError(f"calculator task: {error!r}") from None
        self.turn = 0

    def observe(self, player: int) -> list[Message]:
        return [Message.system(INSTRUCTIONS), Message.user(self.question)]

    def step(self, action: str) -> StepResult:
        self.turn += 1
        call = CALL.search(action)
        if call is not None and self.turn < self.config.turns:
            try:
                result, bad = f"Result: {shown(calculate(call.group(1)))}", 0.0
            except (ValueError, ArithmeticError) as error:
                result, bad = f"Result: error ({error})", 1.0
            # The host adds each metric up over the steps: a call counts where it is made, so
            # an episode cut short by the host's turn limit still counts its calls.
            return (
                StepResult.next([0.0], 0)
                .say(0, Message.user(result))
                .metric("calls", 1.0)
                .metric("bad_calls", bad)
            )
        correct = last_number(action) == self.answer
        # Every metric on the last step too, so that an evaluation without a call shows 0 calls.
        return (
            StepResult.end([1.0 if correct else 0.0])
            .metric("correct", float(correct))
            .metric("calls", 0.0)
            .metric("bad_calls", 0.0)
        )

    def demonstration(self) -> Optional[str]:
        """What a tool user does: the first turn calls the calculator with the problem's
        expression (where the task has one and the episode has a turn left to answer in), the
        next one answers with the result."""
        if self.turn == 0 and self.expression is not None and self.config.turns > 1:
            return f"<calc>{self.expression}</calc>"
        return f"The answer is {self.answer}."
