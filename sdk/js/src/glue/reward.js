// The WIT exports of a reward component, delegating to the class marked with `plugin`.

import * as convert from "./convert.js";

function scores(values) {
  return Array.from(values, Number);
}

export const metadata = {
  metadata: () => convert.metadata("reward"),
};

export const reward = {
  score: (config, task, transcripts) =>
    convert.guarded(() =>
      scores(convert.registered("reward").score(config, task, transcripts.map(convert.transcript))),
    ),
  scoreGroup: (config, task, episodes) =>
    convert.guarded(() => {
      const grouped = convert.registered("reward").scoreGroup(
        config,
        task,
        episodes.map((episode) => episode.map(convert.transcript)),
      );
      return grouped === null || grouped === undefined ? undefined : grouped.map(scores);
    }),
};
