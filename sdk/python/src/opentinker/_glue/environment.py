"""The episode resource of an environment component, delegating to the class marked with
`@opentinker.plugin`: `start` makes one, or refuses with the plugin's error."""

from typing import Optional

import opentinker
from wit_world.exports import environment  # type: ignore[import-not-found]
from wit_world.imports import types  # type: ignore[import-not-found]

import _convert


class Episode(environment.Episode):
    def __init__(self, inner: opentinker.Environment) -> None:
        self.inner = inner

    @classmethod
    def start(cls, config: str, task: str, seed: int) -> "Episode":
        try:
            return cls(opentinker.registered("environment")(config, task, seed))
        except Exception as exception:
            raise _convert.error(exception) from None

    def observe(self, player: int) -> list[types.Message]:
        try:
            return _convert.messages(self.inner.observe(player))
        except Exception as exception:
            raise _convert.error(exception) from None

    def step(self, action: str) -> environment.StepResult:
        try:
            result = self.inner.step(action)
        except Exception as exception:
            raise _convert.error(exception) from None
        return environment.StepResult(
            messages=[
                types.PlayerMessages(player=player, messages=_convert.messages(said))
                for player, said in result.messages
            ],
            rewards=[float(r) for r in result.rewards],
            next_player=result.next_player,
            metrics=_convert.metrics(result.metrics),
        )

    def legal_actions(self) -> Optional[list[str]]:
        return self.inner.legal_actions()

    def demonstration(self) -> Optional[str]:
        return self.inner.demonstration()
