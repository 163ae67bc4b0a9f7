// Build one JavaScript plugin into a component: bundle its module, the SDK and the glue of its
// kind into one ES module with esbuild (the WIT imports stay imports), then componentize it.
// Run by `opentinker plugin build` from the toolchain folder, with one argument: a JSON object
// `{ entry, sdk, wit, world, bundle, output }` of absolute paths and the world's name. The bundle
// and the WIT must lie under the folder it runs in: componentize-js reads them through a WASI
// program that sees only that folder.

import { writeFile } from "node:fs/promises";
import { relative } from "node:path";
import { build } from "esbuild";
import { componentize } from "@bytecodealliance/componentize-js";

const job = JSON.parse(process.argv[2]);

await build({
  entryPoints: [job.entry],
  bundle: true,
  format: "esm",
  platform: "neutral",
  target: "es2022",
  outfile: job.bundle,
  alias: { opentinker: job.sdk },
  external: ["opentinker:plugin/*"],
  logLevel: "warning",
});

const { component } = await componentize({
  sourcePath: relative(process.cwd(), job.bundle),
  witPath: relative(process.cwd(), job.wit),
  worldName: job.world,
  // No fetch: a plugin has no network. Console output, clocks and randomness are the host's
  // neutered WASI (the episode's log, a fixed clock, seeded generators).
  disableFeatures: ["http", "fetch-event"],
});
await writeFile(job.output, component);
