// The types of the opentinker JavaScript SDK (`index.js`, which documents each).

export class PluginError extends Error {
  constructor(message: string);
}

export type Role = "system" | "user" | "assistant" | "tool";

export class Message {
  constructor(role: Role | string, content: string);
  role: string;
  content: string;
  static system(content: string): Message;
  static user(content: string): Message;
  static assistant(content: string): Message;
  static tool(content: string): Message;
}

export interface Metric {
  name: string;
  value: number;
}

export interface PlayerMessages {
  player: number;
  messages: Message[];
}

export interface Transcript {
  player: number;
  messages: Message[];
}

export interface EnvInfo {
  name: string;
  /** Default 1. */
  players?: number;
  /** Default 0: no limit of the environment's own. */
  maxTurns?: number;
}

export class StepResult {
  constructor(rewards: number[], nextPlayer?: number | null);
  rewards: number[];
  nextPlayer: number | null;
  messages: PlayerMessages[];
  metrics: Metric[];
  static next(rewards: number[], nextPlayer: number): StepResult;
  static end(rewards: number[]): StepResult;
  say(player: number, message: Message): this;
  metric(name: string, value: number): this;
}

/** A JSON Schema, as an object. */
export type JsonSchema = Record<string, unknown>;

export class Environment {
  static configSchema: JsonSchema | null;
  static info(): EnvInfo;
  static generateTask(config: string, seed: number): string;
  constructor(config: string, task: string, seed: number);
  observe(player: number): Message[];
  step(action: string): StepResult;
  legalActions(): string[] | null;
  demonstration(): string | null;
}

export class Agent {
  static configSchema: JsonSchema | null;
  constructor(config: string, player: number, seed: number);
  prompt(history: Message[]): Message[];
  act(completion: string): string;
}

export class Reward {
  static configSchema: JsonSchema | null;
  static score(config: string, task: string, transcripts: Transcript[]): number[];
  static scoreGroup(config: string, task: string, episodes: Transcript[][]): number[][] | null;
}

export interface Tensor {
  name: string;
  shape: number[];
  values: number[];
}

export class ObjectiveDatum {
  logprobs: number[];
  inputs: Tensor[];
  constructor(logprobs: number[], inputs: Tensor[]);
  input(name: string): number[] | null;
  require(name: string): number[];
}

export interface DatumLoss {
  value: number;
  gradient: number[];
  metrics?: Metric[];
}

export class Objective {
  static configSchema: JsonSchema | null;
  static loss(config: string, datum: ObjectiveDatum): DatumLoss;
}

export class Advantage {
  static configSchema: JsonSchema | null;
  static advantages(config: string, group: number[][]): number[][];
}

export type PluginKind = "environment" | "agent" | "reward" | "objective" | "advantage";

type PluginClass =
  | typeof Environment
  | typeof Agent
  | typeof Reward
  | typeof Objective
  | typeof Advantage;

export function plugin<T extends PluginClass>(cls: T): T;
export function registered(kind: PluginKind): PluginClass;

export const LogLevel: Readonly<{
  TRACE: "trace";
  DEBUG: "debug";
  INFO: "info";
  WARN: "warn";
  ERROR: "error";
}>;
export type LogLevelName = (typeof LogLevel)[keyof typeof LogLevel];
export function log(level: LogLevelName, message: string): void;
export function setHostLog(log: (level: LogLevelName, message: string) => void): void;

export function foldSeed(seed: bigint | number): number;

export class Rng {
  constructor(seed: number | bigint);
  nextU32(): number;
  float(): number;
  int(low: number, high: number): number;
  choice<T>(items: readonly T[]): T;
  shuffle<T>(items: T[]): T[];
}
export function rng(seed: number | bigint): Rng;

/** The config's fields, with the types and values of `defaults`. */
export function parseConfig<T extends Record<string, unknown>>(config: string, defaults: T): T;
export function configSchemaOf(defaults: Record<string, unknown>): JsonSchema;
