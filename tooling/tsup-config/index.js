// The build of every @engram package: one ESM bundle per entry with its declarations and
// source maps, for Node 22. A package's tsup.config.ts spreads it and adds its entries.

/** The shared tsup options (entry `src/index.ts`). */
export const library = {
  entry: ["src/index.ts"],
  format: ["esm"],
  dts: true,
  clean: true,
  sourcemap: true,
  target: "node22",
}

export default library
