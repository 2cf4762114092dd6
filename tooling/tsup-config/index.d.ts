/** The shared tsup options (entry `src/index.ts`, ESM, declarations, source maps, Node 22). */
export declare const library: {
  entry: string[]
  format: ["esm"]
  dts: true
  clean: true
  sourcemap: true
  target: "node22"
}
/** An app's runnable entry point (`dist/main.js`), the @engram packages bundled from source. */
export declare const app: (entry?: Record<string, string>) => {
  entry: Record<string, string>
  format: ["esm"]
  dts: false
  clean: false
  sourcemap: true
  target: "node22"
  platform: "node"
  noExternal: RegExp[]
  esbuildOptions: (options: { conditions?: string[] }) => void
}
export default library
