// An environment that misbehaves in `step`, as its config's `break` says, so the sandbox tests
// can check a JavaScript plugin is contained as a Rust one is:
//
// - `loop`: loops forever (expected: `out_of_fuel`);
// - `memory`: allocates 1 MiB buffers without end (expected: `memory_limit`, or the engine's own
//   out-of-memory error reported as the plugin's fault: either way only this episode ends);
// - `probe`: looks for the host's wall clock and environment, and rewards 1 for anything found
//   (expected: completes with reward 0; the component has no fetch and no file system at all);
// - `raise`: throws a `TypeError` (expected: `plugin_error` with its text).
//
// Config (JSON): `{"break": "loop"}`.

import { Environment, Message, StepResult, plugin } from "opentinker";

export class Adversary extends Environment {
  static info() {
    return { name: "adversary-js", players: 1, maxTurns: 5 };
  }

  static generateTask(config, seed) {
    return "{}";
  }

  constructor(config, task, seed) {
    super(config, task, seed);
    this.mode = JSON.parse(config || "{}").break ?? "raise";
  }

  observe(player) {
    return [Message.user("Say anything.")];
  }

  step(action) {
    if (this.mode === "loop") {
      for (;;) {}
    }
    if (this.mode === "memory") {
      const buffers = [];
      for (;;) {
        buffers.push(new Uint8Array(1 << 20).fill(1));
      }
    }
    if (this.mode === "probe") {
      return StepResult.end([probe().length > 0 ? 1 : 0]);
    }
    throw new TypeError(`deliberate fault for action ${JSON.stringify(action)}`);
  }
}

/** What of the host this plugin could see: nothing, in the sandbox. */
export function probe() {
  const found = [];
  if (Date.now() > 86_400_000) {
    found.push("wall clock");
  }
  if (typeof process !== "undefined" && process.env !== undefined && Object.keys(process.env).length > 0) {
    found.push("environment");
  }
  return found;
}

plugin(Adversary);
