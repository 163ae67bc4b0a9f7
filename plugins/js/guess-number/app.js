// Guess the number: a secret in 1..max; each guess is answered "higher" or "lower" until the
// policy finds it or runs out of turns. Finding it on turn t of T gives reward (T - t + 1) / T;
// running out gives 0. A reply with no number is an invalid action: it costs a turn and is told
// so. The rules of `plugins/guess-number`, on the JavaScript SDK.
//
// Config (JSON): `{"max": 100, "turns": 10, "demonstrations": "binary", "split": 0.5}`.
// Task (JSON): `{"secret": 37}`.

import {
  Environment,
  Message,
  PluginError,
  StepResult,
  configSchemaOf,
  parseConfig,
  plugin,
  rng,
} from "opentinker";

/** The most turns any config may allow (`info().maxTurns`). */
export const MAX_TURNS = 32;

const DEFAULTS = { max: 100, turns: 10, demonstrations: "binary", split: 0.5, show_range: false };

export function readConfig(text) {
  const config = parseConfig(text, DEFAULTS);
  if (!Number.isInteger(config.max) || config.max < 2) {
    throw new PluginError("guess-number config: `max` must be an integer of at least 2");
  }
  if (!(config.split >= 0 && config.split <= 1)) {
    throw new PluginError("guess-number config: `split` must be in 0..=1");
  }
  if (!Number.isInteger(config.turns) || config.turns < 1 || config.turns > MAX_TURNS) {
    throw new PluginError(`guess-number config: \`turns\` must be in 1..=${MAX_TURNS}`);
  }
  if (config.demonstrations !== "binary" && config.demonstrations !== "random") {
    throw new PluginError("guess-number config: `demonstrations` must be `binary` or `random`");
  }
  return config;
}

/** The last whole number in `text`, or null. */
export function lastNumber(text) {
  const numbers = text.match(/-?\d+(?:\.\d+)?/g);
  if (numbers === null) {
    return null;
  }
  const value = Number(numbers[numbers.length - 1]);
  return Number.isInteger(value) && value >= 0 ? value : null;
}

export class GuessNumber extends Environment {
  static configSchema = configSchemaOf(DEFAULTS);

  static info() {
    return { name: "guess-number-js", players: 1, maxTurns: MAX_TURNS };
  }

  static generateTask(config, seed) {
    const parsed = readConfig(config);
    return JSON.stringify({ secret: rng(seed).int(1, parsed.max) });
  }

  constructor(config, task, seed) {
    super(config, task, seed);
    this.config = readConfig(config);
    let parsed;
    try {
      parsed = JSON.parse(task);
    } catch (error) {
      throw new PluginError(`guess-number task: ${error.message}`);
    }
    this.secret = parsed?.secret;
    if (!Number.isInteger(this.secret) || this.secret < 1 || this.secret > this.config.max) {
      throw new PluginError(
        `guess-number task: secret ${JSON.stringify(this.secret)} is not in 1..=${this.config.max}`,
      );
    }
    this.turn = 0;
    this.low = 1;
    this.high = this.config.max;
    // Not the task's own stream: the first random guess would then be the secret.
    this.rng = rng(seed + 1);
  }

  observe(player) {
    return [
      Message.system("Find the secret number. Reply with one number per turn."),
      Message.user(
        `I am thinking of a number from 1 to ${this.config.max}. ` +
          `You have ${this.config.turns} guesses. Your guess?`,
      ),
    ];
  }

  step(action) {
    this.turn += 1;
    const turnsLeft = this.config.turns - this.turn;
    const guess = lastNumber(action);
    if (guess === null) {
      return this.#metrics(this.#continueOrEnd("That is not a number.", turnsLeft), true);
    }
    if (guess === this.secret) {
      const total = this.config.turns;
      const result = StepResult.end([(total - this.turn + 1) / total]).say(
        0,
        Message.user(`Yes, it is ${guess}!`),
      );
      return this.#metrics(result.metric("found", 1), false);
    }
    let hint;
    if (guess < this.secret) {
      this.low = Math.max(this.low, guess + 1);
      hint = "Higher.";
    } else {
      this.high = Math.min(this.high, Math.max(guess - 1, 0));
      hint = "Lower.";
    }
    return this.#metrics(this.#continueOrEnd(hint, turnsLeft), false);
  }

  demonstration() {
    if (this.config.demonstrations === "binary") {
      return String(this.low + Math.floor((this.high - this.low) * this.config.split));
    }
    return String(this.rng.int(this.low, Math.max(this.low, this.high)));
  }

  #metrics(result, invalid) {
    return result.metric("invalid_action", invalid ? 1 : 0);
  }

  #continueOrEnd(hint, turnsLeft) {
    if (turnsLeft === 0) {
      const message = Message.user(`${hint} No guesses left: it was ${this.secret}.`);
      return StepResult.end([0]).say(0, message).metric("found", 0);
    }
    const shown = this.config.show_range ? ` It is from ${this.low} to ${this.high}.` : "";
    return StepResult.next([0], 0).say(
      0,
      Message.user(`${hint}${shown} ${turnsLeft} guesses left. Your guess?`),
    );
  }
}

plugin(GuessNumber);
