// A coordinator as a child process (tsx src/main.ts), as operators run it.
import { spawn } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

const appDir = join(dirname(fileURLToPath(import.meta.url)), "..", "..")

export interface ChildCoordinator {
  readonly url: string
  readonly process: ChildProcess
  readonly output: () => string
  readonly exited: Promise<number | null>
}

/** Starts `src/main.ts` with `env` (port 0) and answers once it prints its URL. */
export const startChild = (env: Readonly<Record<string, string>>, timeoutMs = 90_000): Promise<ChildCoordinator> =>
  new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--import", "tsx", "--conditions=@engram/source", "src/main.ts"], {
      cwd: appDir,
      env: { ...process.env, ENGRAM_PORT: "0", ...env },
      stdio: ["ignore", "pipe", "pipe"],
    })
    let out = ""
    let done = false
    const exited = new Promise<number | null>((r) => child.on("exit", (code) => r(code)))
    const timer = setTimeout(() => {
      if (!done) {
        done = true
        child.kill("SIGKILL")
        reject(new Error(`coordinator did not start in ${timeoutMs} ms:\n${out}`))
      }
    }, timeoutMs)
    const onData = (chunk: Buffer) => {
      out += chunk.toString()
      const m = /listening on (http:\/\/[0-9.]+:[0-9]+)/.exec(out)
      if (m?.[1] !== undefined && !done) {
        done = true
        clearTimeout(timer)
        resolve({ url: m[1], process: child, output: () => out, exited })
      }
    }
    child.stdout?.on("data", onData)
    child.stderr?.on("data", onData)
    void exited.then((code) => {
      if (!done) {
        done = true
        clearTimeout(timer)
        reject(new Error(`coordinator exited with ${code} before listening:\n${out}`))
      }
    })
  })

/** What a coordinator process said before it ended: its exit code and its JSON log lines. */
export interface Ended {
  readonly code: number | null
  readonly lines: readonly { readonly level: string; readonly msg: string }[]
}

/**
 * Runs the coordinator's process (`src/main.ts`, as operators run it) to its end with exactly
 * `env` (add `process.env` yourself) and JSON logs; answers its exit code and log lines.
 */
export const runToEnd = (env: Record<string, string | undefined>): Promise<Ended> =>
  new Promise((resolve) => {
    const child = spawn(process.execPath, ["--import", "tsx", "--conditions=@engram/source", "src/main.ts"], {
      cwd: appDir,
      env: { ...env, ENGRAM_LOG_FORMAT: "json" },
      stdio: ["ignore", "pipe", "pipe"],
    })
    let out = ""
    child.stdout.on("data", (b: Buffer) => (out += b.toString()))
    child.stderr.on("data", (b: Buffer) => (out += b.toString()))
    child.on("close", (code) =>
      resolve({
        code,
        lines: out
          .trim()
          .split("\n")
          .filter((l) => l.startsWith("{"))
          .map((l) => JSON.parse(l) as { level: string; msg: string }),
      }),
    )
  })
