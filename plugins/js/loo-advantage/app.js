// A leave-one-out advantage estimator (RLOO, Ahmadian et al. 2024), which the host does not
// have: each episode's return minus the mean return of the other episodes of its group, the
// same for each of its turns. Unlike `R - mean(R)` over the whole group, the baseline never
// contains the episode's own return, so the estimate is unbiased; it is `n / (n - 1)` times the
// group-mean advantage. With `"normalise": true` it is divided by the group's standard deviation
// (a group whose returns are all equal gets zeros).
//
// Config (JSON): `{"normalise": false}`.

import { Advantage, PluginError, configSchemaOf, parseConfig, plugin } from "opentinker";

const DEFAULTS = { normalise: false };

export class LeaveOneOut extends Advantage {
  static configSchema = configSchemaOf(DEFAULTS);

  static advantages(config, group) {
    const { normalise } = parseConfig(config, DEFAULTS);
    const returns = group.map((turns) => turns.reduce((sum, r) => sum + r, 0));
    const n = returns.length;
    if (n < 2) {
      if (n === 1) return [group[0].map(() => 0)];
      throw new PluginError("a group needs at least one episode");
    }
    const total = returns.reduce((sum, r) => sum + r, 0);
    let advantages = returns.map((r) => r - (total - r) / (n - 1));
    if (normalise) {
      const mean = total / n;
      const std = Math.sqrt(returns.reduce((sum, r) => sum + (r - mean) ** 2, 0) / n);
      advantages = advantages.map((a) => (std > 0 ? a / std : 0));
    }
    return group.map((turns, i) => turns.map(() => advantages[i]));
  }
}

plugin(LeaveOneOut);
