// The WIT exports of an environment component, delegating to the class marked with `plugin`.

import * as convert from "./convert.js";

class Episode {
  constructor(inner) {
    this.inner = inner;
  }

  static start(config, task, seed) {
    const Plugin = convert.guarded(() => convert.registered("environment"));
    return new Episode(convert.guarded(() => new Plugin(config, task, convert.foldSeed(seed))));
  }

  observe(player) {
    return convert.guarded(() => convert.messages(this.inner.observe(player)));
  }

  step(action) {
    return convert.guarded(() => convert.stepResult(this.inner.step(action)));
  }

  legalActions() {
    return convert.optionalStrings(this.inner.legalActions());
  }

  demonstration() {
    return convert.optionalString(this.inner.demonstration());
  }
}

export const metadata = {
  metadata: () => convert.metadata("environment"),
};

export const environment = {
  info: () => convert.envInfo(convert.registered("environment").info()),
  generateTask: (config, seed) =>
    convert.guarded(() => String(convert.registered("environment").generateTask(config, convert.foldSeed(seed)))),
  Episode,
};
