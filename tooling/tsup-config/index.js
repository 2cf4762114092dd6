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
 * An app's runnable entry point (`dist/main.js`, `node dist/main.js` without tsx): the
 * workspace's @engram packages are bundled in from their sources, so the app runs with only
 * its third-party dependencies installed; those stay external.
 */
export const app = (entry = { main: "src/main.ts" }) => ({
  entry,
  format: ["esm"],
  dts: false,
  clean: false,
  sourcemap: true,
  target: "node22",
  platform: "node",
  noExternal: [/^@engram\//],
  esbuildOptions(options) {
    options.conditions = ["@engram/source", ...(options.conditions ?? [])]
  },
})

export default library
