// The SDK's own rules, run natively by Node's test runner.

import assert from "node:assert/strict";
import { test } from "node:test";
import {
  Advantage,
  Agent,
  Environment,
  Message,
  Objective,
  ObjectiveDatum,
  PluginError,
  Reward,
  StepResult,
  configSchemaOf,
  foldSeed,
  parseConfig,
  plugin,
  registered,
  rng,
} from "../src/index.js";

test("a step result collects each player's messages and the metrics", () => {
  const result = StepResult.next([0, 1], 1)
    .say(1, Message.user("your move"))
    .say(0, Message.user("wait"))
    .say(1, Message.user("again"))
    .metric("invalid_action", 0);
  assert.deepEqual(result.rewards, [0, 1]);
  assert.equal(result.nextPlayer, 1);
  assert.deepEqual(
    result.messages.map((m) => [m.player, m.messages.map((x) => x.content)]),
    [
      [1, ["your move", "again"]],
      [0, ["wait"]],
    ],
  );
  assert.deepEqual(result.metrics, [{ name: "invalid_action", value: 0 }]);
  assert.equal(StepResult.end([1]).nextPlayer, null);
});

test("the same seed gives the same numbers, another seed others", () => {
  const draw = (seed) => {
    const random = rng(seed);
    return Array.from({ length: 16 }, () => random.int(0, 1 << 30));
  };
  assert.deepEqual(draw(7), draw(7));
  assert.notDeepEqual(draw(7), draw(8));
});

test("rng draws stay in range and cover it", () => {
  const random = rng(42);
  const seen = new Set();
  for (let i = 0; i < 2000; i += 1) {
    const value = random.int(3, 9);
    assert.ok(value >= 3 && value <= 9);
    seen.add(value);
    const x = random.float();
    assert.ok(x >= 0 && x < 1);
  }
  assert.equal(seen.size, 7);
  assert.deepEqual(random.shuffle([1, 2, 3, 4]).sort(), [1, 2, 3, 4]);
  assert.throws(() => random.choice([]), PluginError);
});

test("a 64-bit seed folds to a safe integer that every bit changes", () => {
  const max = (1n << 64n) - 1n;
  assert.ok(Number.isSafeInteger(foldSeed(max)));
  assert.equal(foldSeed(5n), 5);
  assert.notEqual(foldSeed(1n << 60n), foldSeed(0n));
  assert.deepEqual(rng(1n << 60n).nextU32(), rng(foldSeed(1n << 60n)).nextU32());
});

test("a config takes its defaults and refuses unknown fields and wrong types by name", () => {
  const defaults = { max: 100, mode: "binary", strict: false };
  assert.deepEqual(parseConfig("", defaults), defaults);
  assert.deepEqual(parseConfig('{"max": 7}', defaults), { ...defaults, max: 7 });
  assert.throws(() => parseConfig('{"maxx": 7}', defaults), /unknown config field `maxx` \(known: max, mode, strict\)/);
  assert.throws(() => parseConfig('{"max": "7"}', defaults), /`max` must be number/);
  assert.throws(() => parseConfig("[1]", defaults), /must be a JSON object/);
  assert.throws(() => parseConfig("{", defaults), /not JSON/);
});

test("the config schema lists each field with its type and default, and no others", () => {
  const schema = configSchemaOf({ max: 100, mode: "binary" });
  assert.equal(schema.additionalProperties, false);
  assert.deepEqual(schema.properties.max, { type: "number", default: 100 });
  assert.deepEqual(schema.properties.mode, { type: "string", default: "binary" });
});

test("one class per kind is registered, and only subclasses", () => {
  class Env extends Environment {}
  class Other extends Environment {}
  class Talker extends Agent {}
  class Score extends Reward {}
  assert.equal(plugin(Env), Env);
  assert.equal(plugin(Env), Env);
  assert.throws(() => plugin(Other), /two environment plugins: Env and Other/);
  plugin(Talker);
  plugin(Score);
  assert.equal(registered("environment"), Env);
  assert.equal(registered("agent"), Talker);
  assert.equal(registered("reward"), Score);
  assert.throws(() => plugin(class NotAPlugin {}), /not a subclass/);
});

test("the base agent passes history and completion through", () => {
  const agent = new Agent("{}", 0, 0);
  const history = [Message.user("hi")];
  assert.deepEqual(agent.prompt(history), history);
  assert.notEqual(agent.prompt(history), history);
  assert.equal(agent.act("go"), "go");
});

test("objectives and estimators are kinds of their own, and a datum names a missing input", () => {
  class Loss extends Objective {
    static loss(config, datum) {
      const mask = datum.require("mask");
      return { value: -datum.logprobs.reduce((a, b) => a + b, 0), gradient: mask.map((m) => -m) };
    }
  }
  class Centred extends Advantage {}
  plugin(Loss);
  plugin(Centred);
  assert.equal(registered("objective"), Loss);
  assert.equal(registered("advantage"), Centred);
  const datum = new ObjectiveDatum([-1, -2], [{ name: "mask", shape: [2], values: [1, 0] }]);
  assert.deepEqual(Loss.loss("{}", datum), { value: 3, gradient: [-1, -0] });
  assert.equal(datum.input("weights"), null);
  assert.throws(() => datum.require("advantages"), (e) => e instanceof PluginError && /"advantages"/.test(e.message));
  assert.throws(() => Centred.advantages("{}", [[1]]), PluginError);
});
