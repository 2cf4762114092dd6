/**
 * End-to-end fixture: a real coordinator (in-process, `startCoordinator`) and host agents as
 * child processes (`tsx src/main.ts`), talking HTTP. Admin calls go through `fetch`.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { pathToFileURL } from "node:url"
import { freePort } from "@engram/test-pg"
import { statusToken } from "../../src/MoveToken.js"

const pkgDir = resolve(import.meta.dirname, "../..")

/** test-pg's: a free port below the kernel's ephemeral range, which no outgoing connection takes meanwhile. */
export { freePort }

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** The agent's JSON log lines (`{time, level, msg, …fields}`) with this message (and session, when given). */
export const logLines = (a: AgentProcess, msg: string, sessionId?: string): Record<string, unknown>[] =>
  a.output
    .flatMap((l) => {
      try {
        return [JSON.parse(l) as Record<string, unknown>]
      } catch {
        return []
      }
    })
    .filter((l) => l.msg === msg && (sessionId === undefined || l.sessionId === sessionId))

/** Polls `f` until it answers a value that `ok` accepts, or throws after `timeoutMs`. */
export const until = async <A>(what: string, f: () => Promise<A>, ok: (a: A) => boolean, timeoutMs = 15_000): Promise<A> => {
  const deadline = Date.now() + timeoutMs
  let last: A | undefined
  while (Date.now() < deadline) {
    last = await f()
    if (ok(last)) return last
    await sleep(100)
  }
  throw new Error(`timed out waiting for ${what}; last: ${JSON.stringify(last)}`)
}

/**
 * Waits until the coordinator holds a report of `hostId`'s agent made at or after `sinceMs` and
 * reads the host as not silent. A restarted agent's host takes placements again only then: a
 * restart slower than the stale window (tsx compiles on start, slow on a loaded machine) leaves
 * the host silent, and a create or resume placed meanwhile queues (202), until its first report.
 */
export const reportedSince = (admin: Api, hostId: string, sinceMs: number, timeoutMs = 120_000) =>
  until(
    `${hostId} reported since ${new Date(sinceMs).toISOString()}`,
    async () => (await admin.call("GET", `/v1/hosts/${hostId}`)).body,
    (h) => h?.silent !== true && typeof h?.reportedAt === "number" && h.reportedAt >= sinceMs,
    timeoutMs,
  )

export interface Api {
  readonly call: (method: string, path: string, body?: unknown) => Promise<{ status: number; body: any }> // eslint-disable-line @typescript-eslint/no-explicit-any
}

export const api = (url: string, token: string): Api => ({
  call: async (method, path, body) => {
    const res = await fetch(`${url}${path}`, {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    })
    const text = await res.text()
    return { status: res.status, body: text === "" ? null : JSON.parse(text) }
  },
})

export interface AgentProcess {
  readonly hostId: string
  readonly port: number
  readonly child: ChildProcess
  readonly output: string[]
  /** The agent's directory: its state file, descent images (and a QEMU agent's VM directory). */
  readonly dir: string
  readonly status: () => Promise<any> // eslint-disable-line @typescript-eslint/no-explicit-any
  readonly kill: (signal?: NodeJS.Signals) => Promise<void>
}

export const PEER_SECRET = "e2e-peer-secret-0123456789"

/** What an agent of a registered host needs to start (see {@link registerHosts}). */
export interface HostSpawn {
  readonly hostId: string
  readonly port: number
  readonly coordinatorUrl: string
  readonly hostToken: string
  readonly peers: string
}

/**
 * Registers `ids` as hosts at the coordinator (each `POST /v1/hosts` must answer 201) and answers
 * each one's spawn options: a free port of its own, its host token, and every host as a peer.
 */
export const registerHosts = async (admin: Api, coordinatorUrl: string, ids: readonly string[]): Promise<Record<string, HostSpawn>> => {
  const ports = await Promise.all(ids.map(() => freePort()))
  const peers = ids.map((id, i) => `${id}=http://127.0.0.1:${ports[i]}`).join(",")
  const hosts: Record<string, HostSpawn> = {}
  for (const [i, id] of ids.entries()) {
    const created = await admin.call("POST", "/v1/hosts", { id })
    if (created.status !== 201) throw new Error(`POST /v1/hosts ${id}: ${created.status} ${JSON.stringify(created.body)}`)
    hosts[id] = { hostId: id, port: ports[i]!, coordinatorUrl, hostToken: created.body.token as string, peers }
  }
  return hosts
}

/** Spawns one agent process and waits for its ready line. */
export const spawnAgent = async (o: {
  readonly hostId: string
  readonly port: number
  readonly coordinatorUrl: string
  readonly hostToken: string
  readonly peers: string
  readonly env?: Record<string, string>
  /** The agent's directory; a new one by default (the same one again: the agent restarted). */
  readonly dir?: string
  /** How long the agent may take to say it is ready (a QEMU agent may build its guest first). */
  readonly readyTimeoutMs?: number
  /** `ENGRAM_AGENT_IMAGE_DIR` unset (the agent's default) instead of `<dir>/images`. */
  readonly defaultImageDir?: boolean
}): Promise<AgentProcess> => {
  const dir = o.dir ?? mkdtempSync(join(tmpdir(), `engram-agent-${o.hostId}-`))
  // `node --import tsx`, not the tsx CLI: the CLI runs the script in a child process, so a
  // signal to it would not reach the agent itself.
  const child = spawn(process.execPath, ["--import", pathToFileURL(join(pkgDir, "node_modules/tsx/dist/loader.mjs")).href, "--conditions=@engram/source", join(pkgDir, "src/main.ts")], {
    cwd: pkgDir,
    env: {
      ...process.env,
      ENGRAM_HOST_ID: o.hostId,
      ENGRAM_COORDINATOR_URL: o.coordinatorUrl,
      ENGRAM_HOST_TOKEN: o.hostToken,
      ENGRAM_PEER_SECRET: PEER_SECRET,
      ENGRAM_PEERS: o.peers,
      ENGRAM_AGENT_PORT: String(o.port),
      ENGRAM_AGENT_STATE_FILE: join(dir, "state.json"),
      ...(o.defaultImageDir === true ? {} : { ENGRAM_AGENT_IMAGE_DIR: join(dir, "images") }),
      ENGRAM_AGENT_MEASURE: "fixed",
      ENGRAM_SIM_TOTAL_MIB: "4096",
      ENGRAM_SIM_OS_MIB: "0",
      ENGRAM_SIM_VCPUS: "8",
      ...o.env,
    },
    stdio: ["ignore", "pipe", "pipe"],
  })
  const output: string[] = []
  let ready: () => void = () => {}
  const readyP = new Promise<void>((r) => (ready = r))
  const onData = (b: Buffer) => {
    for (const line of b.toString().split("\n")) {
      if (line.trim() === "") continue
      output.push(line)
      if (line.includes("host agent ready")) ready()
    }
  }
  child.stdout?.on("data", onData)
  child.stderr?.on("data", onData)
  const exited = new Promise<void>((r) => child.once("exit", () => r()))
  await Promise.race([
    readyP,
    exited.then(() => {
      throw new Error(`agent ${o.hostId} exited:\n${output.join("\n")}`)
    }),
    sleep(o.readyTimeoutMs ?? 60_000).then(() => {
      throw new Error(`agent ${o.hostId} not ready:\n${output.join("\n")}`)
    }),
  ])
  const statusUrl = `http://127.0.0.1:${o.port}/v1/peer/status`
  return {
    hostId: o.hostId,
    port: o.port,
    child,
    output,
    dir,
    status: async () => {
      const res = await fetch(statusUrl, { headers: { authorization: `Bearer ${statusToken(PEER_SECRET, o.hostId)}` } })
      return res.json()
    },
    kill: async (signal = "SIGTERM") => {
      if (child.exitCode !== null || child.signalCode !== null) return
      child.kill(signal)
      // A graceful stop gets 5 s, then it is killed.
      await Promise.race([exited, sleep(5_000).then(() => void child.kill("SIGKILL"))])
      await exited
    },
  }
}
