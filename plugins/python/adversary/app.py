"""An environment that misbehaves in `step`, as its config's `break` says, so the sandbox tests
can check a Python plugin is contained as a Rust one is:

- `loop`: loops forever (expected: `out_of_fuel`);
- `memory`: allocates 1 MiB blocks without end (expected: `memory_limit`, though Python turns the
  refused growth into a `MemoryError` the plugin could catch);
- `probe`: looks for the host's files, environment, network and clock, and rewards 1 for anything
  found (expected: completes with reward 0);
- `raise`: raises `ValueError` (expected: `plugin_error` with the exception's text).

Config (JSON): `{"break": "loop"}`.
"""

import os
import opentinker
from opentinker import EnvInfo, Message, StepResult


@opentinker.plugin
class Adversary(opentinker.Environment):
    @classmethod
    def info(cls) -> EnvInfo:
        return EnvInfo(name="adversary-py", players=1, max_turns=5)

    @classmethod
    def generate_task(cls, config: str, seed: int) -> str:
        return "{}"

    def __init__(self, config: str, task: str, seed: int) -> None:
        import json

        self.mode = json.loads(config or "{}").get("break", "raise")

    def observe(self, player: int) -> list[Message]:
        return [Message.user("Say anything.")]

    def step(self, action: str) -> StepResult:
        if self.mode == "loop":
            while True:
                pass
        if self.mode == "memory":
            blocks = []
            while True:
                blocks.append(bytearray(1 << 20))
        if self.mode == "probe":
            return StepResult.end([1.0 if probe() else 0.0])
        raise ValueError(f"deliberate fault for action {action!r}")


def probe() -> list[str]:
    """What of the host this plugin could see: nothing, in the sandbox."""
    found = []
    for path in ("/etc/passwd", "/proc/self/environ", "/", "."):
        try:
            if os.listdir(path) if os.path.isdir(path) else open(path).read(1):
                found.append(path)
        except OSError:
            pass
    if any(key not in ("PYTHONPATH", "PYTHONHOME") for key in os.environ):
        found.append("environment")
    try:
        import socket

        socket.create_connection(("127.0.0.1", 22), timeout=1)
        found.append("network")
    except Exception:
        pass
    import time

    if time.time() > 86400:
        found.append("wall clock")
    return found
