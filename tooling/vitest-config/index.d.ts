/** The shared vitest options (merge a package's own over them with vitest's `mergeConfig`). */
export declare const base: {
  resolve: { conditions: string[] }
  ssr: { resolve: { conditions: string[] } }
  test: {
    include: string[]
    testTimeout: number
    hookTimeout: number
    isolate: boolean
    reporters: (string | [string, Record<string, unknown>] | import("vitest/node").Reporter)[]
  }
}
export default base
