// The WIT exports of an objective component, delegating to the class marked with `plugin`.

import { ObjectiveDatum } from "opentinker";
import * as convert from "./convert.js";

function datum(value) {
  const inputs = value.inputs.map((t) => ({
    name: t.name,
    shape: Array.from(t.shape),
    values: Array.from(t.values),
  }));
  return new ObjectiveDatum(Array.from(value.logprobs), inputs);
}

export const metadata = {
  metadata: () => convert.metadata("objective"),
};

export const objective = {
  loss: (config, datums) =>
    convert.guarded(() => {
      const cls = convert.registered("objective");
      return datums.map((value) => {
        const loss = cls.loss(config, datum(value));
        return {
          value: Number(loss.value),
          gradient: Float32Array.from(loss.gradient, Number),
          metrics: convert.metrics(loss.metrics ?? []),
        };
      });
    }),
};
