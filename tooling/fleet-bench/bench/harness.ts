/**
 * What the fleet bench's scripts share (`main.ts`, `freeze.ts`): the coordinator's process and
 * the load generator's (`driver.ts`, driven by JSON lines on stdin), set-up HTTP, a process's CPU
 * seconds, bounded parallelism.
 */
import { buildForBench, coordinatorArgs, coordinatorMode } from "@engram/bench"
import type { CoordinatorMode } from "@engram/bench"
import { spawn } from "node:child_process"
import type { ChildProcess } from "node:child_process"
import { openSync, readFileSync } from "node:fs"
import http from "node:http"
import { dirname, join } from "node:path"
import { createInterface } from "node:readline"
import { fileURLToPath } from "node:url"

const here = dirname(fileURLToPath(import.meta.url))

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** CPU seconds (user + system) process `pid` has used. */
export const cpuSecondsOf = (pid: number | undefined): number => {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.split(" ") ?? []
  return (Number(stat[11]) + Number(stat[12])) / 100
}

/** Runs `task` for 0..n-1 with `limit` in flight. */
export const inParallel = async (n: number, limit: number, task: (i: number) => Promise<void>): Promise<void> => {
  let next = 0
  await Promise.all(
    Array.from({ length: Math.min(limit, n) }, async () => {
      while (next < n) await task(next++)
    }),
  )
}

export interface Driver {
  readonly send: <A>(command: Record<string, unknown>) => Promise<A>
  /** The load generator's CPU seconds so far (user + system): whether it, not the coordinator, was the bottleneck. */
  readonly cpuSeconds: () => number
  readonly stop: () => Promise<void>
}

export const startDriver = (): Driver => {
  const child = spawn(process.execPath, ["--import", "tsx", join(here, "driver.ts")], { stdio: ["pipe", "pipe", "inherit"] })
  const waiting = new Map<number, (value: unknown) => void>()
  let next = 0
  void (async () => {
    for await (const line of createInterface({ input: child.stdout })) {
      const { id, value } = JSON.parse(line) as { id: number; value: unknown }
      waiting.get(id)?.(value)
      waiting.delete(id)
    }
  })()
  return {
    cpuSeconds: () => cpuSecondsOf(child.pid),
    send: <A>(command: Record<string, unknown>) =>
      new Promise<A>((resolve) => {
        const id = next++
        waiting.set(id, resolve as (value: unknown) => void)
        child.stdin.write(`${JSON.stringify({ ...command, id })}\n`)
      }),
    stop: async () => {
      if (child.exitCode !== null) return
      const exited = new Promise((r) => child.once("exit", r))
      child.stdin.write(`${JSON.stringify({ cmd: "stop", id: -1 })}\n`)
      await Promise.race([exited, sleep(5000)])
      if (child.exitCode === null) child.kill("SIGKILL")
    },
  }
}

// ---- set-up HTTP -------------------------------------------------------------------------------

const setupAgent = new http.Agent({ keepAlive: true, maxSockets: 64 })

/** Closes the set-up pool's idle sockets (at the end of a script, so it can exit). */
export const closeRequests = (): void => setupAgent.destroy()

/** One request over a keep-alive pool (set-up and reads, not the measured load): its status and body. `token` "" sends none. */
export const request = (url: string, method: string, path: string, token: string, body?: unknown, timeoutMs?: number): Promise<{ status: number; text: string }> =>
  new Promise((resolve, reject) => {
    const u = new URL(url)
    const text = body === undefined ? undefined : JSON.stringify(body)
    const headers: Record<string, string | number> = token === "" ? {} : { authorization: `Bearer ${token}` }
    if (text !== undefined) Object.assign(headers, { "content-type": "application/json", "content-length": Buffer.byteLength(text) })
    const req = http.request({ agent: setupAgent, host: u.hostname, port: u.port, method, path, headers, ...(timeoutMs === undefined ? {} : { timeout: timeoutMs }) }, (res) => {
      let data = ""
      res.on("data", (c: Buffer) => (data += c.toString()))
      res.on("end", () => resolve({ status: res.statusCode ?? 0, text: data }))
    })
    req.on("timeout", () => req.destroy(new Error(`${method} ${path}: no answer in ${timeoutMs} ms`)))
    req.on("error", reject)
    req.end(text)
  })

/** A metric's value in the coordinator's `/metrics`, by its exact name (summed over its labels). */
export const metricValue = async (url: string, token: string, name: string): Promise<number> => {
  const r = await request(url, "GET", "/metrics", token)
  return r.text.split("\n").filter((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`)).reduce((s, l) => s + Number(l.split(" ").at(-1)), 0)
}

export interface Agent {
  readonly id: string
  readonly token: string
}

/** Registers and reports `n` hosts (`<prefix>00000`…) over HTTP, 64 at a time, answering each with its agent's token. */
export const registerHosts = async (url: string, token: string, n: number, prefix: string, report: unknown): Promise<Agent[]> => {
  const out: Agent[] = new Array(n)
  await inParallel(n, 64, async (i) => {
    const id = `${prefix}${String(i).padStart(5, "0")}`
    const r = await request(url, "POST", "/v1/hosts", token, { id })
    if (r.status !== 201) throw new Error(`register ${id}: ${r.status} ${r.text}`)
    const p = await request(url, "PUT", `/v1/hosts/${id}/report`, token, report)
    if (p.status !== 200) throw new Error(`report ${id}: ${p.status} ${p.text}`)
    out[i] = { id, token: (JSON.parse(r.text) as { token: string }).token }
  })
  return out
}

// ---- the coordinator's process -----------------------------------------------------------------

export interface CoordinatorProcess {
  readonly url: string
  readonly child: ChildProcess
  /** SIGTERM (after a SIGCONT, should it be stopped), SIGKILL if it has not exited within 15 s. */
  readonly stop: () => Promise<void>
}

/**
 * Starts the coordinator `run` names (`coordinatorToRun` of @engram/bench: a checkout's built
 * `dist/main.js`, or its `src/main.ts` under tsx) on `port` (Node `flags` and `--import`
 * `preload` before it), its stderr given to `onStderr`, and waits until `/livez` answers (at
 * most 180 s; an exit or the deadline fails with the tail of its stderr).
 */
export const spawnCoordinator = async (options: {
  readonly run: { readonly mode: CoordinatorMode; readonly main: string; readonly cwd: string }
  readonly port: number
  readonly env: Readonly<Record<string, string | undefined>>
  readonly flags?: readonly string[]
  readonly preload?: readonly string[]
  readonly onStderr?: (text: string) => void
}): Promise<CoordinatorProcess> => {
  const child = spawn(process.execPath, coordinatorArgs(options.run, options.flags, options.preload), {
    cwd: options.run.cwd,
    env: { ...options.env, ENGRAM_PORT: String(options.port) },
    // `FLEET_COORDINATOR_STDOUT=<file>`: its stdout appended there (what V8's `--trace-gc*` flags print).
    stdio: ["ignore", options.env["FLEET_COORDINATOR_STDOUT"] === undefined ? "ignore" : openSync(options.env["FLEET_COORDINATOR_STDOUT"], "a"), "pipe"],
  })
  let stderr = ""
  child.stderr?.on("data", (d: Buffer) => {
    const text = d.toString()
    options.onStderr?.(text)
    stderr = (stderr + text).slice(-4000)
  })
  const url = `http://127.0.0.1:${options.port}`
  const deadline = Date.now() + 180_000
  for (;;) {
    if (child.exitCode !== null) throw new Error(`coordinator exited ${child.exitCode}: ${stderr}`)
    if ((await request(url, "GET", "/livez", "").catch(() => ({ status: 0 }))).status === 200) break
    if (Date.now() > deadline) {
      child.kill("SIGKILL")
      throw new Error(`coordinator did not answer /livez within 180 s: ${stderr}`)
    }
    await sleep(100)
  }
  return {
    url,
    child,
    stop: async () => {
      if (child.exitCode !== null) return
      const exited = new Promise((r) => child.once("exit", r))
      child.kill("SIGCONT")
      child.kill("SIGTERM")
      await Promise.race([exited, sleep(15_000)])
      if (child.exitCode === null) child.kill("SIGKILL")
    },
  }
}

// ---- a coordinator in this process -------------------------------------------------------------

/**
 * For a script that starts the coordinator in its own process (`edge.ts`, `waiter-memory.ts`),
 * by `FLEET_COORDINATOR`: `dist` (the default) loads `@engram/coordinator` and
 * `@engram/store-sim` from their builds (made now; a build that fails falls back to the sources,
 * saying so, unless `dist` was asked for), `source` from their sources under tsx. What an import
 * resolves to follows Node's `--conditions`, fixed for a process: when this process's are the
 * other mode's, the script runs again in a child with the right ones and this process exits
 * with the child's code. Import those packages after this answers (`await import(…)`).
 */
export const coordinatorInProcess = async (script: string): Promise<CoordinatorMode> => {
  const again = process.env["FLEET_COORDINATOR_IN_CHILD"]
  let mode: CoordinatorMode
  if (again === "dist" || again === "source") mode = again
  else {
    const asked = coordinatorMode("FLEET_COORDINATOR")
    mode = asked.mode
    if (mode === "dist") {
      const built = buildForBench(join(here, "..", "..", ".."), ["@engram/coordinator", "@engram/store-sim"])
      if (!built.ok) {
        if (asked.explicit) throw new Error(`FLEET_COORDINATOR=dist: the coordinator did not build: ${built.error}`)
        console.log(`the coordinator did not build, so this run measures its SOURCE under tsx (FLEET_COORDINATOR=source): ${built.error}`)
        mode = "source"
      }
    }
  }
  const sourceNow = import.meta.resolve("@engram/coordinator").endsWith(".ts")
  if (sourceNow !== (mode === "source")) {
    if (again !== undefined) throw new Error(`FLEET_COORDINATOR=${mode}: @engram/coordinator still resolves to ${import.meta.resolve("@engram/coordinator")} (a --conditions in NODE_OPTIONS?)`)
    const flags: string[] = []
    for (let i = 0; i < process.execArgv.length; i++) {
      const a = process.execArgv[i] as string
      if (a === "--conditions=@engram/source" || a === "-C=@engram/source") continue
      if ((a === "--conditions" || a === "-C") && process.execArgv[i + 1] === "@engram/source") {
        i++
        continue
      }
      flags.push(a)
    }
    if (mode === "source") flags.push("--conditions=@engram/source")
    const child = spawn(process.execPath, [...flags, script, ...process.argv.slice(2)], { stdio: "inherit", env: { ...process.env, FLEET_COORDINATOR_IN_CHILD: mode } })
    for (const signal of ["SIGINT", "SIGTERM"] as const) process.on(signal, () => child.kill(signal))
    return new Promise<never>(() => child.on("exit", (code) => process.exit(code ?? 1)))
  }
  // tsx turned source maps on for this process; `node dist/main.js` runs without them.
  if (mode === "dist") process.setSourceMapsEnabled(false)
  return mode
}
