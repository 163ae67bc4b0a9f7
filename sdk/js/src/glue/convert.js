// Conversions between the SDK's values and the WIT bindings' (used only inside a component), and
// the component's metadata. The build bundles this folder with the plugin's own module.

import { log } from "opentinker:plugin/host@0.3.0";
import { Message, PluginError, foldSeed, registered, setHostLog } from "opentinker";
import { PACKAGE } from "./package.js";

setHostLog(log);

export { foldSeed, registered };

/** Run `body`, turning anything it throws into the WIT `plugin-error` of a failed call. */
export function guarded(body) {
  try {
    return body();
  } catch (error) {
    throw witError(error);
  }
}

/** The WIT error of a thrown value: a `PluginError`'s text, or any other's name and text. */
export function witError(error) {
  if (error instanceof PluginError) {
    return { message: error.message };
  }
  if (error instanceof Error) {
    return { message: `${error.name}: ${error.message}` };
  }
  return { message: `thrown: ${String(error)}` };
}

export function message(value) {
  if (value === null || typeof value !== "object") {
    throw new PluginError(`a message must be a Message, not ${JSON.stringify(value)}`);
  }
  return { role: String(value.role), content: String(value.content) };
}

export function messages(values) {
  if (!Array.isArray(values)) {
    throw new PluginError(`messages must be an array, not ${JSON.stringify(values)}`);
  }
  return values.map(message);
}

export function transcript(value) {
  return { player: value.player, messages: value.messages.map((m) => new Message(m.role, m.content)) };
}

export function envInfo(value) {
  return {
    name: String(value.name),
    players: value.players ?? 1,
    maxTurns: value.maxTurns ?? 0,
  };
}

/** WIT metrics of `{ name, value }` values. */
export function metrics(values) {
  return values.map((m) => ({ name: String(m.name), value: Number(m.value) }));
}

export function stepResult(value) {
  return {
    messages: (value.messages ?? []).map((m) => ({ player: m.player, messages: messages(m.messages) })),
    rewards: Array.from(value.rewards, Number),
    nextPlayer: value.nextPlayer ?? undefined,
    metrics: metrics(value.metrics ?? []),
  };
}

/** Some list of strings, or none. */
export function optionalStrings(value) {
  return value === null || value === undefined ? undefined : Array.from(value, String);
}

/** Some string, or none. */
export function optionalString(value) {
  return value === null || value === undefined ? undefined : String(value);
}

/** The component's metadata: its package's fields, its kind, and its class's config schema. */
export function metadata(kind) {
  const schema = registered(kind).configSchema;
  return {
    name: PACKAGE.name,
    version: PACKAGE.version,
    description: PACKAGE.description,
    license: PACKAGE.license || undefined,
    kinds: [kind],
    configSchema: schema === null || schema === undefined ? undefined : JSON.stringify(schema),
    language: "javascript",
  };
}
