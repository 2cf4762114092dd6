/** The shared tsup options (entry `src/index.ts`, ESM, declarations, source maps, Node 22). */
export declare const library: {
  entry: string[]
  format: ["esm"]
  dts: true
  clean: true
  sourcemap: true
  target: "node22"
}
export default library
