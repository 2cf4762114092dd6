/** The oldest Node.js engram supports; every package's `engines.node` is `>=` this. */
export declare const minimum: { readonly major: number; readonly minor: number }
/** The one line for `version` (default: this process's), or null when it is supported. */
export declare const unsupported: (version?: string) => string | null
/** Ends the process with exit code 1 and the one line when this Node is too old. */
export declare const exitIfUnsupported: () => void
