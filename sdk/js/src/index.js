/**
 * Write opentinker plugins in JavaScript.
 *
 * An opentinker plugin is a WebAssembly component that the host runs sandboxed: an `Environment`
 * (a game, a tool task, a math problem), an `Agent` (how a policy's text becomes an action), a
 * `Reward` function, a training `Objective` (a loss and its gradient by each logprob) or an
 * `Advantage` estimator. Subclass the matching base class and mark it with `plugin(...)`; the WIT
 * bindings stay behind this package. `opentinker plugin build DIR` builds the component with
 * componentize-js (a pinned version it installs with npm outside the project).
 *
 * A complete environment, a coin the policy must call:
 *
 * ```js
 * import { Environment, Message, StepResult, plugin } from "opentinker";
 *
 * export class CallTheCoin extends Environment {
 *   static info() {
 *     return { name: "call-the-coin", players: 1, maxTurns: 1 };
 *   }
 *   constructor(config, task, seed) {
 *     super(config, task, seed);
 *     this.heads = seed % 2 === 0;
 *   }
 *   observe(player) {
 *     return [Message.user("I flipped a coin. Answer `heads` or `tails`.")];
 *   }
 *   step(action) {
 *     const calledHeads = action.trim().toLowerCase() === "heads";
 *     return StepResult.end([calledHeads === this.heads ? 1 : 0]);
 *   }
 * }
 * plugin(CallTheCoin);
 * ```
 *
 * The rules are the Rust and Python SDKs': the same config, task, seed and actions give the same
 * transcript (use `rng(seed)`, never the clock); an illegal action is a normal result (a penalty,
 * metric `invalid_action`), and a thrown error is the plugin's own fault, which ends only its
 * episode. Seeds are plain numbers (safe integers): the host's 64-bit seed folded to 53 bits.
 *
 * @module opentinker
 */

/**
 * A fault of the plugin itself: a bad config, a task it cannot parse, a broken invariant. Any
 * other error a plugin throws is reported the same way, with its name and message.
 */
export class PluginError extends Error {
  constructor(message) {
    super(message);
    this.name = "PluginError";
  }
}

/** One chat message: `role` is `system`, `user`, `assistant` or `tool`. */
export class Message {
  constructor(role, content) {
    this.role = String(role);
    this.content = String(content);
  }

  static system(content) {
    return new Message("system", content);
  }

  static user(content) {
    return new Message("user", content);
  }

  static assistant(content) {
    return new Message("assistant", content);
  }

  static tool(content) {
    return new Message("tool", content);
  }
}

/** What one call of `Environment.step` returns. */
export class StepResult {
  /**
   * @param {number[]} rewards one per player
   * @param {number | null} nextPlayer the player who acts next; `null` ends the episode
   */
  constructor(rewards, nextPlayer = null) {
    this.rewards = Array.from(rewards, Number);
    this.nextPlayer = nextPlayer;
    /** New messages, `{ player, messages }` per player who should see them. */
    this.messages = [];
    /** Named numbers for logging, `{ name, value }`. */
    this.metrics = [];
  }

  /** The episode goes on; `nextPlayer` acts next. */
  static next(rewards, nextPlayer) {
    return new StepResult(rewards, nextPlayer);
  }

  /** The episode ends with this step. */
  static end(rewards) {
    return new StepResult(rewards, null);
  }

  /** Show `message` to `player` (it reaches the policy with its next turn). */
  say(player, message) {
    const entry = this.messages.find((m) => m.player === player);
    if (entry) {
      entry.messages.push(message);
    } else {
      this.messages.push({ player, messages: [message] });
    }
    return this;
  }

  /**
   * Report a named number for this step. The host adds up each metric over the episode's steps:
   * report a count's increments, or a total once, on the last step.
   */
  metric(name, value) {
    this.metrics.push({ name: String(name), value: Number(value) });
    return this;
  }
}

/**
 * A task environment. The host makes one value per episode with `new (config, task, seed)`, asks
 * each player what it sees with `observe`, then calls `step` with the action of the player to move
 * until a step says no one moves next.
 */
export class Environment {
  /**
   * The JSON Schema of the config the constructor takes (see `configSchemaOf`), shown in the
   * component's metadata and checked against a job's config before any work; `null`: none.
   */
  static configSchema = null;

  /** The environment's name, number of players and turn limit: `{ name, players, maxTurns }`. */
  static info() {
    throw new PluginError("the environment does not say its info: define static info()");
  }

  /** Make a task for a data-free environment; the same config and seed give the same task. */
  static generateTask(config, seed) {
    throw new PluginError("this environment does not generate tasks: give the job a task dataset");
  }

  /** Start an episode. A throw here (a bad config or task) refuses it. */
  constructor(config, task, seed) {}

  /** What `player` sees before its first action: a list of `Message`. */
  observe(player) {
    throw new PluginError("the environment does not define observe(player)");
  }

  /** Apply the action of the player to move; returns a `StepResult`. */
  step(action) {
    throw new PluginError("the environment does not define step(action)");
  }

  /** The legal actions of the player to move, if the environment can list them. */
  legalActions() {
    return null;
  }

  /** A legal, ideally good, action for the player to move. */
  demonstration() {
    return null;
  }
}

/**
 * How a policy talks to an environment: what it is shown, and how its text becomes an action. The
 * host makes one value per player per episode with `new (config, player, seed)`, so an agent may
 * keep state from turn to turn.
 */
export class Agent {
  /** The JSON Schema of the config the constructor takes; `null`: none declared. */
  static configSchema = null;

  /** Start the agent of `player` (the job's `[agent] config`, JSON). A throw ends the episode. */
  constructor(config, player, seed) {}

  /** The chat messages the policy sees, given the conversation so far. */
  prompt(history) {
    return [...history];
  }

  /** Parse a sampled completion into an action. */
  act(completion) {
    return completion;
  }
}

/** A reward function over finished episodes. */
export class Reward {
  /** The JSON Schema of the config the scorers take; `null`: none declared. */
  static configSchema = null;

  /**
   * One score per player of a finished episode of `task`, under `config` (the job's
   * `[reward] config`, JSON); `transcripts` are `{ player, messages }`.
   */
  static score(config, task, transcripts) {
    throw new PluginError("the reward does not define static score(config, task, transcripts)");
  }

  /**
   * Scores for a group of episodes of one task, one list per episode; `null` (the default) when
   * the reward has no group scorer.
   */
  static scoreGroup(config, task, episodes) {
    return null;
  }
}

/**
 * What an objective sees of one datum: `logprobs`, the policy's logprob of each target token (what
 * the loss is differentiated by), and `inputs`, the datum's other tensors as
 * `{ name, shape, values }`: `mask` (1 where a target token counts), `weights`, `advantages`,
 * `logprobs` (the sampler's), or a name the datum's `loss_fn_inputs` gave it.
 */
export class ObjectiveDatum {
  constructor(logprobs, inputs) {
    this.logprobs = logprobs;
    this.inputs = inputs;
  }

  /** The values of the input `name`, or `null` if the datum has none. */
  input(name) {
    const tensor = this.inputs.find((t) => t.name === name);
    return tensor === undefined ? null : tensor.values;
  }

  /** The values of the input `name`, or a `PluginError` that names it. */
  require(name) {
    const values = this.input(name);
    if (values === null) {
      throw new PluginError(`the datum has no input ${JSON.stringify(name)}`);
    }
    return values;
  }
}

/**
 * A training objective: the loss of a `forward_backward` call or of an RL job's steps. The engine
 * computes the policy's logprobs, calls `loss` for each datum, and back-propagates the returned
 * gradient through the model in the same pass as its built-in losses. A datum's loss must depend
 * on that datum alone (a call's datums may come in several batches).
 */
export class Objective {
  /** The JSON Schema of the config `loss` takes; `null`: none declared. */
  static configSchema = null;

  /**
   * The loss of `datum` (an `ObjectiveDatum`) under `config` (JSON; `{}` when absent), as
   * `{ value, gradient, metrics }`: its value, its derivative with respect to each of the datum's
   * logprobs, and `{ name, value }` metrics (added over the call's datums; a name ending in
   * `:mean` is averaged instead).
   */
  static loss(config, datum) {
    throw new PluginError("the objective does not define static loss(config, datum)");
  }
}

/**
 * An advantage estimator: how a group of episodes of one task turns the rewards of their turns
 * into each turn's advantage (the host's default is GRPO's `R - mean(R)`).
 */
export class Advantage {
  /** The JSON Schema of the config `advantages` takes; `null`: none declared. */
  static configSchema = null;

  /**
   * Per episode of `group` (each given as an array of its turns' rewards), the advantage of each
   * turn, as many as it has rewards, under `config` (JSON; `{}` when absent).
   */
  static advantages(config, group) {
    throw new PluginError("the estimator does not define static advantages(config, group)");
  }
}

const KINDS = {
  environment: Environment,
  agent: Agent,
  reward: Reward,
  objective: Objective,
  advantage: Advantage,
};
const registeredClasses = new Map();

/**
 * Mark `cls` (a subclass of `Environment`, `Agent`, `Reward`, `Objective` or `Advantage`) as this
 * component's plugin of its kind; returns `cls`.
 */
export function plugin(cls) {
  for (const [kind, base] of Object.entries(KINDS)) {
    if (typeof cls === "function" && cls.prototype instanceof base) {
      const previous = registeredClasses.get(kind);
      if (previous !== undefined && previous !== cls) {
        throw new TypeError(`two ${kind} plugins: ${previous.name} and ${cls.name}`);
      }
      registeredClasses.set(kind, cls);
      return cls;
    }
  }
  throw new TypeError(
    `${cls?.name ?? String(cls)} is not a subclass of Environment, Agent, Reward, Objective or Advantage`,
  );
}

/** The class marked with `plugin` for `kind` (used by the component's glue). */
export function registered(kind) {
  const cls = registeredClasses.get(kind);
  if (cls === undefined) {
    throw new PluginError(`no ${kind} class is marked with plugin(...)`);
  }
  return cls;
}

/** How important a log line is. */
export const LogLevel = Object.freeze({
  TRACE: "trace",
  DEBUG: "debug",
  INFO: "info",
  WARN: "warn",
  ERROR: "error",
});

let hostLog = null;

/** Used by the component's glue: route `log` to the host's import. */
export function setHostLog(log) {
  hostLog = log;
}

/**
 * Append a line to the episode's log, kept by the host within a byte budget. Outside a component
 * (unit tests) the line goes to stderr.
 */
export function log(level, message) {
  if (!Object.values(LogLevel).includes(level)) {
    throw new PluginError(`log level \`${level}\`: use one of ${Object.values(LogLevel).join(", ")}`);
  }
  if (hostLog === null) {
    console.error(`[${level}] ${message}`);
  } else {
    hostLog(level, String(message));
  }
}

/** The host's 64-bit seed as the safe integer plugins see: every bit of it folded into 53. */
export function foldSeed(seed) {
  const wide = BigInt.asUintN(64, BigInt(seed));
  return Number(BigInt.asUintN(53, wide ^ (wide >> 53n)));
}

/** A seeded random generator (sfc32, seeded through splitmix32): the same seed, the same numbers. */
export class Rng {
  constructor(seed) {
    const folded = typeof seed === "bigint" ? foldSeed(seed) : Number(seed);
    if (!Number.isSafeInteger(folded)) {
      throw new PluginError(`rng seed ${seed} is not an integer`);
    }
    let mix = (folded % 0x100000000) >>> 0;
    const high = Math.floor(folded / 0x100000000) >>> 0;
    const splitmix = () => {
      mix = (mix + 0x9e3779b9) | 0;
      let z = mix ^ Math.imul(high, 0x85ebca6b);
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
      return (z ^ (z >>> 16)) >>> 0;
    };
    this.state = [splitmix(), splitmix(), splitmix(), 1];
    for (let i = 0; i < 12; i += 1) {
      this.nextU32();
    }
  }

  /** The next 32 random bits, as an unsigned integer. */
  nextU32() {
    const s = this.state;
    const t = (((s[0] + s[1]) | 0) + s[3]) | 0;
    s[3] = (s[3] + 1) | 0;
    s[0] = s[1] ^ (s[1] >>> 9);
    s[1] = (s[2] + (s[2] << 3)) | 0;
    s[2] = (s[2] << 21) | (s[2] >>> 11);
    s[2] = (s[2] + t) | 0;
    return t >>> 0;
  }

  /** A number in [0, 1). */
  float() {
    return this.nextU32() / 0x100000000;
  }

  /** An integer in `low..=high`. */
  int(low, high) {
    if (!Number.isInteger(low) || !Number.isInteger(high) || high < low) {
      throw new PluginError(`rng.int(${low}, ${high}): give integers with low <= high`);
    }
    return low + Math.floor(this.float() * (high - low + 1));
  }

  /** One element of a non-empty array. */
  choice(items) {
    if (items.length === 0) {
      throw new PluginError("rng.choice of an empty array");
    }
    return items[this.int(0, items.length - 1)];
  }

  /** Shuffle `items` in place (Fisher-Yates) and return it. */
  shuffle(items) {
    for (let i = items.length - 1; i > 0; i -= 1) {
      const j = this.int(0, i);
      [items[i], items[j]] = [items[j], items[i]];
    }
    return items;
  }
}

/** A random generator for `seed`: the same seed gives the same numbers everywhere. */
export function rng(seed) {
  return new Rng(seed);
}

function jsonType(value) {
  if (typeof value === "number") {
    return "number";
  }
  if (typeof value === "string") {
    return "string";
  }
  if (typeof value === "boolean") {
    return "boolean";
  }
  if (Array.isArray(value)) {
    return "array";
  }
  return null;
}

/**
 * Parse a JSON config into an object with the fields of `defaults`: missing fields take their
 * defaults, and an unknown field or a value of another type than its default's is a `PluginError`
 * naming it.
 */
export function parseConfig(config, defaults) {
  let raw;
  try {
    raw = config.trim() === "" ? {} : JSON.parse(config);
  } catch (error) {
    throw new PluginError(`the config is not JSON: ${error.message}`);
  }
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) {
    throw new PluginError(`the config must be a JSON object, not ${JSON.stringify(raw)}`);
  }
  const known = Object.keys(defaults);
  const parsed = { ...defaults };
  for (const [name, value] of Object.entries(raw)) {
    if (!Object.hasOwn(defaults, name)) {
      throw new PluginError(`unknown config field \`${name}\` (known: ${known.sort().join(", ")})`);
    }
    const expected = jsonType(defaults[name]);
    if (expected !== null && jsonType(value) !== expected) {
      throw new PluginError(`config field \`${name}\` must be ${expected}, not ${JSON.stringify(value)}`);
    }
    parsed[name] = value;
  }
  return parsed;
}

/**
 * The JSON Schema of the config `parseConfig(text, defaults)` accepts: an object of the fields of
 * `defaults`, each typed as its default and with it, and no others. Set it as a plugin class's
 * `static configSchema`.
 */
export function configSchemaOf(defaults) {
  const properties = {};
  for (const [name, value] of Object.entries(defaults)) {
    const type = jsonType(value);
    properties[name] = type === null ? { default: value } : { type, default: value };
  }
  return {
    $schema: "https://json-schema.org/draft/2020-12/schema",
    type: "object",
    additionalProperties: false,
    properties,
  };
}
