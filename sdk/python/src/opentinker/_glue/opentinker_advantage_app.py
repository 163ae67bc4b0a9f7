"""The component's glue for an advantage estimator: the WIT exports, delegating to the class
marked with `@opentinker.plugin`."""

import _opentinker_user  # noqa: F401  (the plugin's own module: registers its class)
import opentinker
from wit_world import exports  # type: ignore[import-not-found]
from wit_world.exports import advantage  # type: ignore[import-not-found]
from wit_world.exports import metadata as wit_metadata  # type: ignore[import-not-found]

import _convert


class Metadata(exports.Metadata):
    def metadata(self) -> wit_metadata.PluginMetadata:
        return _convert.metadata("advantage")


class Advantage(exports.Advantage):
    def advantages(self, config: str, group: list[advantage.Episode]) -> list[list[float]]:
        try:
            cls = opentinker.registered("advantage")
            rewards = [list(episode.turn_rewards) for episode in group]
            return [[float(a) for a in turns] for turns in cls.advantages(config, rewards)]
        except Exception as exception:
            raise _convert.error(exception) from None
