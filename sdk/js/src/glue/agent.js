// The WIT exports of an agent component, one agent per player per episode, delegating to the
// class marked with `plugin`.

import { Message } from "opentinker";
import * as convert from "./convert.js";

class PlayerAgent {
  constructor(inner) {
    this.inner = inner;
  }

  static start(config, player, seed) {
    const Plugin = convert.guarded(() => convert.registered("agent"));
    return new PlayerAgent(convert.guarded(() => new Plugin(config, player, convert.foldSeed(seed))));
  }

  prompt(history) {
    return convert.guarded(() =>
      convert.messages(this.inner.prompt(history.map((m) => new Message(m.role, m.content)))),
    );
  }

  act(completion) {
    return convert.guarded(() => String(this.inner.act(completion)));
  }
}

export const metadata = {
  metadata: () => convert.metadata("agent"),
};

export const agent = { PlayerAgent };
