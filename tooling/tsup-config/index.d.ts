/** The shared tsup options (entry `src/index.ts`, ESM, declarations, source maps, Node 22). */
export declare const library: {
  entry: string[]
  format: ["esm"]
  dts: true
  clean: true
  sourcemap: true
  target: "node22"
}
/** An app's runnable entry point (`dist/main.js`); `bundle` says what goes into the file. */
export declare const app: (options?: { entry?: Record<string, string>; bundle?: "none" | "engram" | "all" }) => {
  entry: Record<string, string>
  format: ["esm"]
  dts: false
  clean: false
  sourcemap: true
  target: "node22"
  platform: "node"
  noExternal: RegExp[]
  external: RegExp[]
  esbuildOptions: (options: { conditions?: string[] }) => void
}
export default library
