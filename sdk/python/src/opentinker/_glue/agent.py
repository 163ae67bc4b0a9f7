"""The agent resource of an agent component, one per player per episode, delegating to the class
marked with `@opentinker.plugin`."""

import opentinker
from wit_world.exports import agent  # type: ignore[import-not-found]
from wit_world.imports import types  # type: ignore[import-not-found]

import _convert


class PlayerAgent(agent.PlayerAgent):
    def __init__(self, inner: opentinker.Agent) -> None:
        self.inner = inner

    @classmethod
    def start(cls, config: str, player: int, seed: int) -> "PlayerAgent":
        try:
            return cls(opentinker.registered("agent")(config, player, seed))
        except Exception as exception:
            raise _convert.error(exception) from None

    def prompt(self, history: list[types.Message]) -> list[types.Message]:
        try:
            prompt = self.inner.prompt([_convert.from_message(m) for m in history])
            return _convert.messages(prompt)
        except Exception as exception:
            raise _convert.error(exception) from None

    def act(self, completion: str) -> str:
        try:
            return self.inner.act(completion)
        except Exception as exception:
            raise _convert.error(exception) from None
