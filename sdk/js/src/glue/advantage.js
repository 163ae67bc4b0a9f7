// The WIT exports of an advantage estimator component, delegating to the class marked with
// `plugin`.

import * as convert from "./convert.js";

export const metadata = {
  metadata: () => convert.metadata("advantage"),
};

export const advantage = {
  advantages: (config, group) =>
    convert.guarded(() => {
      const rewards = group.map((episode) => Array.from(episode.turnRewards));
      const answer = convert.registered("advantage").advantages(config, rewards);
      return Array.from(answer, (turns) => Float64Array.from(turns, Number));
    }),
};
