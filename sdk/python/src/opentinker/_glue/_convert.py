"""Conversions between the SDK's types and the WIT bindings' (imported only inside a component),
and the component's metadata."""

from __future__ import annotations

import json

import _opentinker_package
import opentinker
from componentize_py_types import Err  # type: ignore[import-not-found]
from wit_world.exports import metadata as wit_metadata  # type: ignore[import-not-found]
from wit_world.imports import types  # type: ignore[import-not-found]


def error(exception: BaseException) -> Err:
    """The WIT error of an exception: a `PluginError`'s text, or any other's type and text."""
    if isinstance(exception, opentinker.PluginError):
        message = str(exception)
    else:
        message = f"{type(exception).__name__}: {exception}"
    return Err(types.PluginError(message=message))


def message(value: opentinker.Message) -> types.Message:
    return types.Message(role=value.role, content=value.content)


def messages(values: list[opentinker.Message]) -> list[types.Message]:
    return [message(value) for value in values]


def from_message(value: types.Message) -> opentinker.Message:
    return opentinker.Message(value.role, value.content)


def from_transcript(value: types.Transcript) -> opentinker.Transcript:
    return opentinker.Transcript(value.player, [from_message(m) for m in value.messages])


def env_info(value: opentinker.EnvInfo) -> types.EnvInfo:
    return types.EnvInfo(name=value.name, players=value.players, max_turns=value.max_turns)


def metrics(values: list[opentinker.Metric]) -> list[types.Metric]:
    return [types.Metric(name=m.name, value=float(m.value)) for m in values]


_KINDS = {
    "environment": wit_metadata.PluginKind.ENVIRONMENT,
    "agent": wit_metadata.PluginKind.AGENT,
    "reward": wit_metadata.PluginKind.REWARD,
    "objective": wit_metadata.PluginKind.OBJECTIVE,
    "advantage": wit_metadata.PluginKind.ADVANTAGE,
}


def metadata(kind: str) -> wit_metadata.PluginMetadata:
    """The component's metadata: its project's fields (written by `opentinker plugin build`), its
    kind, and the config schema of the class marked for that kind."""
    schema = opentinker.registered(kind).config_schema
    return wit_metadata.PluginMetadata(
        name=_opentinker_package.NAME,
        version=_opentinker_package.VERSION,
        description=_opentinker_package.DESCRIPTION,
        license=_opentinker_package.LICENSE or None,
        kinds=[_KINDS[kind]],
        config_schema=None if schema is None else json.dumps(schema),
        language="python",
    )
