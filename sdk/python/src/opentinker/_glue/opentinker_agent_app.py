"""The component's glue for an agent: the WIT exports, delegating to the class marked with
`@opentinker.plugin`."""

import _opentinker_user  # noqa: F401  (the plugin's own module: registers its class)
import opentinker
from wit_world import exports  # type: ignore[import-not-found]
from wit_world.imports import types  # type: ignore[import-not-found]

import _convert


class Agent(exports.Agent):
    def prompt(self, history: list[types.Message]) -> list[types.Message]:
        try:
            agent = opentinker.registered("agent")
            return _convert.messages(agent.prompt([_convert.from_message(m) for m in history]))
        except Exception as exception:
            raise _convert.error(exception) from None

    def act(self, completion: str) -> str:
        try:
            return opentinker.registered("agent").act(completion)
        except Exception as exception:
            raise _convert.error(exception) from None
