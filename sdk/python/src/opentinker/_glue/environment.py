"""The episode resource of an environment component, delegating to the class marked with
`@opentinker.plugin`. The WIT 0.1 constructor cannot fail, so a failed start is kept and reported
by the episode's first call."""

from typing import Optional

import opentinker
from wit_world.exports import environment  # type: ignore[import-not-found]
from wit_world.imports import types  # type: ignore[import-not-found]

import _convert


class Episode(environment.Episode):
    def __init__(self, config: str, task: str, seed: int) -> None:
        self.inner = None
        self.failure: Optional[BaseException] = None
        try:
            self.inner = opentinker.registered("environment")(config, task, seed)
        except Exception as exception:
            self.failure = exception

    def _episode(self):
        if self.inner is None:
            raise _convert.error(self.failure or opentinker.PluginError("the episode did not start"))
        return self.inner

    def observe(self, player: int) -> list[types.Message]:
        episode = self._episode()
        try:
            return _convert.messages(episode.observe(player))
        except Exception as exception:
            raise _convert.error(exception) from None

    def step(self, action: str) -> environment.StepResult:
        episode = self._episode()
        try:
            result = episode.step(action)
        except Exception as exception:
            raise _convert.error(exception) from None
        return environment.StepResult(
            messages=[(player, _convert.messages(said)) for player, said in result.messages],
            rewards=[float(r) for r in result.rewards],
            next_player=result.next_player,
            metrics=_convert.metrics(result.metrics),
        )

    def legal_actions(self) -> Optional[list[str]]:
        if self.inner is None:
            return None
        return self.inner.legal_actions()

    def demonstration(self) -> Optional[str]:
        if self.inner is None:
            return None
        return self.inner.demonstration()
