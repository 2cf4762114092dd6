// The CLI as a real process: `node --import tsx src/main.ts <args>` (or a built entry point),
// with only the environment a test gives it (no ENGRAM_* from the shell that runs the tests).
import { spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"

export const appDir = join(dirname(fileURLToPath(import.meta.url)), "..", "..")

export interface Ran {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/** The CLI's state (its memory of hung replicas) for this test process, not the user's: `XDG_STATE_HOME` unless a test gives its own. */
export const stateHome = mkdtempSync(join(tmpdir(), "engram-cli-state-"))
process.on("exit", () => rmSync(stateHome, { recursive: true, force: true }))

/** The environment without any ENGRAM_* variable of the caller's. */
export const cleanEnv = (): Record<string, string> =>
  Object.fromEntries(Object.entries(process.env).filter((e): e is [string, string] => e[1] !== undefined && !e[0].startsWith("ENGRAM_") && e[0] !== "INIT_CWD"))

/** Runs a command to its end. */
export const runCommand = (command: string, args: readonly string[], options: { readonly env?: Record<string, string>; readonly cwd?: string } = {}): Promise<Ran> =>
  new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd: options.cwd ?? appDir, env: { ...cleanEnv(), NO_COLOR: "1", XDG_STATE_HOME: stateHome, ...options.env }, stdio: ["ignore", "pipe", "pipe"] })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (b: Buffer) => (stdout += b.toString()))
    child.stderr.on("data", (b: Buffer) => (stderr += b.toString()))
    child.on("error", reject)
    child.on("close", (code) => resolve({ code, stdout, stderr }))
  })

/** The `engram` a user runs: the bin, which loads the build (test/support/build.ts builds it before the tests). */
export const bin = join(appDir, "bin", "engram.js")

/** Runs `engram <args>`: the built entry point, as a user runs it. */
export const engram = (args: readonly string[], options: { readonly env?: Record<string, string>; readonly cwd?: string } = {}): Promise<Ran> =>
  runCommand(process.execPath, [bin, ...args], options)

/** Runs `engram <args>` from source through tsx, as `pnpm engram` does. */
export const engramFromSource = (args: readonly string[], options: { readonly env?: Record<string, string>; readonly cwd?: string } = {}): Promise<Ran> =>
  runCommand(process.execPath, ["--import", pathToFileURL(join(appDir, "node_modules/tsx/dist/loader.mjs")).href, "--conditions=@engram/source", join(appDir, "src/main.ts"), ...args], options)
