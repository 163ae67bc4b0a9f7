"""The component's glue for a training objective: the WIT exports, delegating to the class marked
with `@opentinker.plugin`."""

import _opentinker_user  # noqa: F401  (the plugin's own module: registers its class)
import opentinker
from wit_world import exports  # type: ignore[import-not-found]
from wit_world.exports import metadata as wit_metadata  # type: ignore[import-not-found]
from wit_world.exports import objective  # type: ignore[import-not-found]

import _convert


class Metadata(exports.Metadata):
    def metadata(self) -> wit_metadata.PluginMetadata:
        return _convert.metadata("objective")


def _datum(value: objective.Datum) -> opentinker.ObjectiveDatum:
    inputs = [opentinker.Tensor(t.name, list(t.shape), list(t.values)) for t in value.inputs]
    return opentinker.ObjectiveDatum(list(value.logprobs), inputs)


class Objective(exports.Objective):
    def loss(self, config: str, datums: list[objective.Datum]) -> list[objective.DatumLoss]:
        try:
            cls = opentinker.registered("objective")
            answers = []
            for datum in datums:
                loss = cls.loss(config, _datum(datum))
                answers.append(
                    objective.DatumLoss(
                        value=float(loss.value),
                        gradient=[float(g) for g in loss.gradient],
                        metrics=_convert.metrics(loss.metrics),
                    )
                )
            return answers
        except Exception as exception:
            raise _convert.error(exception) from None
