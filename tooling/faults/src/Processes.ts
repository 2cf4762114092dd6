/**
 * Real processes for the fault scenarios: the coordinator (`apps/coordinator/src/main.ts`) and
 * host agents (`apps/host-agent/src/main.ts`, simulated runtime), each `node --import tsx` so a
 * signal reaches the process itself (SIGKILL, SIGSTOP, SIGCONT). Their output is kept for a
 * failure message; every process started here is killed by `killAll` (afterAll).
 */
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { pathToFileURL } from "node:url"
import { MoveToken } from "@engram/host-agent"

const repo = resolve(import.meta.dirname, "../../..")
const coordinatorDir = join(repo, "apps/coordinator")
const agentDir = join(repo, "apps/host-agent")

/** One child process with its output so far. */
export interface Child {
  readonly process: ChildProcess
  readonly output: () => string
  /** Resolves with the exit code (null: killed by a signal) once it exited. */
  readonly exited: Promise<number | null>
  /** Whether it is still running. */
  readonly alive: () => boolean
  /** Sends `signal`; SIGTERM/SIGKILL resolve once it exited (a SIGTERM that hangs 10 s is a SIGKILL). */
  readonly kill: (signal?: NodeJS.Signals) => Promise<void>
}

const started = new Set<ChildProcess>()

const launch = (cwd: string, script: string, env: Readonly<Record<string, string>>, readyLine: RegExp, timeoutMs: number): Promise<{ child: Child; match: RegExpExecArray }> =>
  new Promise((resolveStart, reject) => {
    const loader = pathToFileURL(join(cwd, "node_modules/tsx/dist/loader.mjs")).href
    const proc = spawn(process.execPath, ["--import", loader, "--conditions=@engram/source", script], {
      cwd,
      env: { ...process.env, ENGRAM_LOG_FORMAT: "json", ...env },
      stdio: ["ignore", "pipe", "pipe"],
    })
    started.add(proc)
    let out = ""
    let done = false
    const exited = new Promise<number | null>((r) =>
      proc.once("exit", (code) => {
        started.delete(proc)
        r(code)
      }),
    )
    const alive = () => proc.exitCode === null && proc.signalCode === null
    const child: Child = {
      process: proc,
      output: () => out,
      exited,
      alive,
      kill: async (signal = "SIGTERM") => {
        if (!alive()) return
        proc.kill(signal)
        if (signal === "SIGSTOP" || signal === "SIGCONT") return
        const timer = setTimeout(() => proc.kill("SIGKILL"), 10_000)
        await exited
        clearTimeout(timer)
      },
    }
    const timer = setTimeout(() => {
      if (done) return
      done = true
      proc.kill("SIGKILL")
      reject(new Error(`${script} did not start in ${timeoutMs} ms:\n${out}`))
    }, timeoutMs)
    const onData = (chunk: Buffer) => {
      out += chunk.toString()
      // Keep the tail only: a long scenario logs a lot.
      if (out.length > 200_000) out = out.slice(-100_000)
      const m = readyLine.exec(out)
      if (m !== null && !done) {
        done = true
        clearTimeout(timer)
        resolveStart({ child, match: m })
      }
    }
    proc.stdout?.on("data", onData)
    proc.stderr?.on("data", onData)
    void exited.then((code) => {
      if (done) return
      done = true
      clearTimeout(timer)
      reject(new Error(`${script} exited with ${code} before it was ready:\n${out}`))
    })
  })

/** A coordinator process and its URL. */
export interface CoordinatorProcess extends Child {
  readonly url: string
}

/** Starts the coordinator with `env` (on port 0 unless `ENGRAM_PORT` is given) and answers once it listens. */
export const startCoordinatorProcess = async (env: Readonly<Record<string, string>>, timeoutMs = 120_000): Promise<CoordinatorProcess> => {
  const { child, match } = await launch(coordinatorDir, "src/main.ts", { ENGRAM_PORT: "0", ...env }, /listening on (http:\/\/[0-9.]+:[0-9]+)/, timeoutMs)
  return { ...child, url: match[1]! }
}

/** The peer secret every agent of the suite shares. */
export const PEER_SECRET = "faults-peer-secret-0123456789"

/** An agent process. */
export interface AgentProcess extends Child {
  readonly hostId: string
  readonly dir: string
  /** The VMs the agent's runtime holds, from its status endpoint (null when it does not answer). */
  readonly vms: () => Promise<readonly { readonly vmId: string; readonly status: string }[] | null>
}

/**
 * Starts a host agent for `hostId` (already registered; `hostToken` is its token) on the
 * simulated runtime with a fixed measure of `totalMib`, and answers once it says ready.
 */
export const startAgentProcess = async (o: {
  readonly hostId: string
  readonly hostToken: string
  readonly coordinatorUrl: string
  readonly totalMib: number
  readonly env?: Readonly<Record<string, string>>
  readonly timeoutMs?: number
}): Promise<AgentProcess> => {
  const dir = mkdtempSync(join(tmpdir(), `engram-faults-agent-${o.hostId}-`))
  dirs.add(dir)
  const { child } = await launch(
    agentDir,
    "src/main.ts",
    {
      ENGRAM_HOST_ID: o.hostId,
      ENGRAM_COORDINATOR_URL: o.coordinatorUrl,
      ENGRAM_HOST_TOKEN: o.hostToken,
      ENGRAM_PEER_SECRET: PEER_SECRET,
      ENGRAM_PEERS: "",
      ENGRAM_AGENT_PORT: "0",
      ENGRAM_AGENT_STATE_FILE: join(dir, "state.json"),
      ENGRAM_AGENT_IMAGE_DIR: join(dir, "images"),
      ENGRAM_AGENT_MEASURE: "fixed",
      ENGRAM_SIM_TOTAL_MIB: String(o.totalMib),
      ENGRAM_SIM_OS_MIB: "0",
      ENGRAM_SIM_VCPUS: "8",
      ...o.env,
    },
    /"host agent ready"/,
    o.timeoutMs ?? 120_000,
  )
  const port = Number(/"port":(\d+)/.exec(child.output().split("\n").find((l) => l.includes("host agent ready")) ?? "")?.[1] ?? Number.NaN)
  return {
    ...child,
    hostId: o.hostId,
    dir,
    vms: async () => {
      if (!Number.isFinite(port)) throw new Error(`agent ${o.hostId}: no port in its ready line:\n${child.output()}`)
      try {
        const res = await fetch(`http://127.0.0.1:${port}/v1/peer/status`, {
          headers: { authorization: `Bearer ${MoveToken.statusToken(PEER_SECRET, o.hostId)}` },
          signal: AbortSignal.timeout(10_000),
        })
        const body = (await res.json()) as { vms: { vmId: string; status: string }[] }
        return body.vms
      } catch {
        return null
      }
    },
  }
}

const dirs = new Set<string>()

/** A temp directory removed by `killAll`. */
export const tempDir = (prefix: string): string => {
  const dir = mkdtempSync(join(tmpdir(), `engram-faults-${prefix}-`))
  dirs.add(dir)
  return dir
}

/** Kills every process started here that still runs (SIGKILL; a stopped one is continued first) and removes the temp dirs. */
export const killAll = async (): Promise<void> => {
  await Promise.all(
    [...started].map(
      (p) =>
        new Promise<void>((r) => {
          if (p.exitCode !== null || p.signalCode !== null) return r()
          p.once("exit", () => r())
          p.kill("SIGCONT")
          p.kill("SIGKILL")
        }),
    ),
  )
  for (const dir of dirs) {
    try {
      rmSync(dir, { recursive: true, force: true })
    } catch {
      // A mount point (the disk-full scenario's tmpfs): its owner unmounts and removes it.
    }
  }
  dirs.clear()
}
