// The estimator's rules, run natively by Node's test runner (no component needed).

import assert from "node:assert/strict";
import { test } from "node:test";

import { PluginError } from "opentinker";
import { LeaveOneOut } from "../app.js";

test("each episode's baseline is the mean of the others' returns", () => {
  // Returns 1, 5, 0: baselines 2.5, 0.5, 3.
  const advantages = LeaveOneOut.advantages("{}", [[0, 1], [5], [0]]);
  assert.deepEqual(advantages, [[-1.5, -1.5], [4.5], [-3]]);
});

test("normalised advantages are divided by the group's standard deviation", () => {
  const [[a], [b]] = LeaveOneOut.advantages('{"normalise": true}', [[1], [3]]);
  // Returns 1 and 3: advantages -2 and 2, standard deviation 1.
  assert.deepEqual([a, b], [-2, 2]);
  assert.deepEqual(LeaveOneOut.advantages('{"normalise": true}', [[2], [2]]), [[0], [0]]);
});

test("a lone episode has no baseline to beat, and a bad config is the plugin's error", () => {
  assert.deepEqual(LeaveOneOut.advantages("{}", [[1, 2]]), [[0, 0]]);
  assert.throws(() => LeaveOneOut.advantages('{"normalize": true}', [[1], [2]]), PluginError);
});
