"""The component's glue for an environment: the WIT exports, delegating to the class marked with
`@opentinker.plugin`. (The episode resource lives in the `environment` module, where
componentize-py looks for it.)"""

import _opentinker_user  # noqa: F401  (the plugin's own module: registers its class)
import opentinker
from wit_world import exports  # type: ignore[import-not-found]
from wit_world.exports import metadata as wit_metadata  # type: ignore[import-not-found]
from wit_world.imports import types  # type: ignore[import-not-found]

import _convert


class Metadata(exports.Metadata):
    def metadata(self) -> wit_metadata.PluginMetadata:
        return _convert.metadata("environment")


class Environment(exports.Environment):
    def info(self) -> types.EnvInfo:
        return _convert.env_info(opentinker.registered("environment").info())

    def generate_task(self, config: str, seed: int) -> str:
        try:
            return opentinker.registered("environment").generate_task(config, seed)
        except Exception as exception:
            raise _convert.error(exception) from None
