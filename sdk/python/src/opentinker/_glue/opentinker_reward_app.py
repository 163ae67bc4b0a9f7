"""The component's glue for a reward: the WIT exports, delegating to the class marked with
`@opentinker.plugin`."""

from typing import Optional

import _opentinker_user  # noqa: F401  (the plugin's own module: registers its class)
import opentinker
from wit_world import exports  # type: ignore[import-not-found]
from wit_world.exports import metadata as wit_metadata  # type: ignore[import-not-found]
from wit_world.imports import types  # type: ignore[import-not-found]

import _convert


class Metadata(exports.Metadata):
    def metadata(self) -> wit_metadata.PluginMetadata:
        return _convert.metadata("reward")


class Reward(exports.Reward):
    def score(self, config: str, task: str, transcripts: list[types.Transcript]) -> list[float]:
        try:
            reward = opentinker.registered("reward")
            scores = reward.score(config, task, [_convert.from_transcript(t) for t in transcripts])
            return [float(s) for s in scores]
        except Exception as exception:
            raise _convert.error(exception) from None

    def score_group(
        self, config: str, task: str, episodes: list[list[types.Transcript]]
    ) -> Optional[list[list[float]]]:
        try:
            reward = opentinker.registered("reward")
            converted = [[_convert.from_transcript(t) for t in e] for e in episodes]
            scores = reward.score_group(config, task, converted)
            return None if scores is None else [[float(s) for s in e] for e in scores]
        except Exception as exception:
            raise _convert.error(exception) from None
