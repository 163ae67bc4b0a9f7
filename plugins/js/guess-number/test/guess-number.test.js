// The environment's rules, run natively by Node's test runner (no component needed).

import assert from "node:assert/strict";
import { test } from "node:test";
import { GuessNumber, lastNumber } from "../app.js";

test("binary search by the demonstrations finds the secret in time", () => {
  for (let seed = 0; seed < 20; seed += 1) {
    const task = GuessNumber.generateTask("{}", seed);
    const episode = new GuessNumber("{}", task, seed);
    let result;
    do {
      result = episode.step(episode.demonstration());
    } while (result.nextPlayer !== null);
    assert.ok(result.rewards[0] > 0, `seed ${seed}: not found`);
  }
});

test("a reply with no number is an invalid action that costs a turn", () => {
  const episode = new GuessNumber('{"turns": 2}', '{"secret": 5}', 0);
  const result = episode.step("no idea");
  assert.equal(result.nextPlayer, 0);
  assert.ok(result.metrics.some((m) => m.name === "invalid_action" && m.value === 1));
  assert.deepEqual(episode.step("still none").rewards, [0]);
});

test("a bad config or task is refused, naming the problem", () => {
  assert.throws(() => new GuessNumber('{"turns": 0}', '{"secret": 5}', 0), /`turns`/);
  assert.throws(() => new GuessNumber('{"maximum": 9}', '{"secret": 5}', 0), /unknown config field `maximum`/);
  assert.throws(() => new GuessNumber("{}", '{"secret": 500}', 0), /secret 500/);
});

test("the last whole number of a reply is the guess", () => {
  assert.equal(lastNumber("I say 12, no, 37"), 37);
  assert.equal(lastNumber("2.5"), null);
  assert.equal(lastNumber("none"), null);
});
