"""The component's glue for an agent: the WIT exports, delegating to the class marked with
`@opentinker.plugin`. (The agent resource lives in the `agent` module, where componentize-py
looks for it.)"""

import _opentinker_user  # noqa: F401  (the plugin's own module: registers its class)
from wit_world import exports  # type: ignore[import-not-found]
from wit_world.exports import metadata as wit_metadata  # type: ignore[import-not-found]

import _convert


class Metadata(exports.Metadata):
    def metadata(self) -> wit_metadata.PluginMetadata:
        return _convert.metadata("agent")


class Agent(exports.Agent):
    pass
