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

/**
 * An app's runnable entry point, `dist/main.js` (run with `node`, no tsx). `bundle` says what
 * goes into the file: `"none"` (every package is imported: the @engram packages from their
 * built `dist`, which `pnpm build` makes; needed where a package reads files beside itself,
 * such as store-pg's migrations and the dashboard's page), `"engram"` (the @engram packages
 * bundled from their sources; third-party packages imported), or `"all"` (one file with
 * everything: a command that starts fast).
 */
export const app = ({ entry = { main: "src/main.ts" }, bundle = "engram" } = {}) => ({
  entry,
  format: ["esm"],
  dts: false,
  clean: false,
  sourcemap: true,
  target: "node22",
  platform: "node",
  noExternal: bundle === "all" ? [/./] : bundle === "engram" ? [/^@engram\//] : [],
  external: bundle === "all" ? [] : bundle === "engram" ? [/^(?!@engram\/)(@[^/]+\/)?[^./][^:]*$/] : [/^(@[^/]+\/)?[^./][^:]*$/],
  esbuildOptions(options) {
    if (bundle !== "none") options.conditions = ["@engram/source", ...(options.conditions ?? [])]
  },
})

export default library
