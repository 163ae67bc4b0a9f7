"""Generate examples/data/chat.jsonl, the chat dataset of examples/sft.toml (deterministic).

Small, regular conversations a tiny model can learn in minutes: greetings, successors, days of
the week, spelling backwards, and two-turn counting. Run: python3 examples/data/make_chat.py
"""

import json
import random
from pathlib import Path

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
NAMES = ["Ada", "Alan", "Grace", "Linus", "Ken", "Barbara", "Edsger", "Donald", "Frances", "John",
         "Margaret", "Dennis", "Radia", "Guido", "Bjarne", "Niklaus", "Leslie", "Tony", "Hedy"]
WORDS = ["cat", "sun", "tree", "rust", "wasm", "lamp", "river", "cloud", "stone", "apple",
         "bread", "chair", "green", "light", "music", "night", "ocean", "plant", "queen", "table"]


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def conversation(rng):
    kind = rng.randrange(5)
    if kind == 0:
        name = rng.choice(NAMES)
        return [user(f"Say hello to {name}."), assistant(f"Hello, {name}!")]
    if kind == 1:
        n = rng.randrange(0, 99)
        return [user(f"What comes after {n}?"), assistant(f"{n + 1} comes after {n}.")]
    if kind == 2:
        i = rng.randrange(7)
        return [user(f"What day comes after {DAYS[i]}?"), assistant(f"{DAYS[(i + 1) % 7]}.")]
    if kind == 3:
        word = rng.choice(WORDS)
        return [user(f"Spell {word} backwards."), assistant(word[::-1])]
    start = rng.randrange(1, 10)
    end = start + rng.randrange(2, 5)
    up = ", ".join(str(k) for k in range(start, end + 1))
    down = ", ".join(str(k) for k in range(end, start - 1, -1))
    return [user(f"Count from {start} to {end}."), assistant(f"{up}."),
            user("Now backwards."), assistant(f"{down}.")]


def main():
    rng = random.Random(0)
    lines = [json.dumps({"messages": conversation(rng)}) for _ in range(480)]
    out = Path(__file__).with_name("chat.jsonl")
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
