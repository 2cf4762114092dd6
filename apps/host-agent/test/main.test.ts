// The agent as operators run it (`src/main.ts`, a real process) beside a real coordinator: it
// says "host agent ready" only once the coordinator took its token, a refused token ends it
// with one clear line and exit 3 (not "ready" and warnings forever), and SIGTERM ends it with 0.
// Started without ENGRAM_PEERS on a host peers reach, it warns of nothing: the coordinator gives the
// sources of moves the peer URL each agent reports.
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { spawn } from "node:child_process"
import { join } from "node:path"
import { pathToFileURL } from "node:url"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { api, freePort, PEER_SECRET, spawnAgent } from "./support/E2e.js"

const adminToken = "main-test-admin-token-0123456789"
const pkgDir = join(import.meta.dirname, "..")
let c: RunningCoordinator

beforeAll(async () => {
  c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
})
afterAll(() => c?.stop())

/** Runs the agent to its end with a token; answers its exit code and output. */
const runToEnd = (hostId: string, hostToken: string): Promise<{ code: number | null; output: string }> =>
  new Promise((resolve) => {
    const child = spawn(process.execPath, ["--import", pathToFileURL(join(pkgDir, "node_modules/tsx/dist/loader.mjs")).href, "--conditions=@engram/source", join(pkgDir, "src/main.ts")], {
      cwd: pkgDir,
      env: {
        ...process.env,
        ENGRAM_HOST_ID: hostId,
        ENGRAM_COORDINATOR_URL: c.url,
        ENGRAM_HOST_TOKEN: hostToken,
        ENGRAM_PEER_SECRET: PEER_SECRET,
        ENGRAM_AGENT_PORT: "0",
        ENGRAM_AGENT_MEASURE: "fixed",
        ENGRAM_LOG_FORMAT: "json",
      },
      stdio: ["ignore", "pipe", "pipe"],
    })
    let output = ""
    child.stdout.on("data", (b: Buffer) => (output += b.toString()))
    child.stderr.on("data", (b: Buffer) => (output += b.toString()))
    child.on("close", (code) => resolve({ code, output }))
  })

describe("the agent's process", () => {
  it("a refused host token ends the agent with one clear line and exit 3, and it never says ready", async () => {
    const hostId = "main-wrong-token"
    expect((await api(c.url, adminToken).call("POST", "/v1/hosts", { id: hostId })).status).toBe(201)
    const r = await runToEnd(hostId, "not-this-hosts-token-0123456789")
    expect(r.code).toBe(3)
    expect(r.output).not.toContain("host agent ready")
    const lines = r.output.trim().split("\n").map((l) => JSON.parse(l) as { level: string; msg: string })
    const fatal = lines.filter((l) => l.level === "fatal")
    expect(fatal).toHaveLength(1)
    // Started without ENGRAM_PEERS, on a host peers reach: nothing to warn about (the coordinator gives the addresses).
    expect(lines.filter((l) => l.level === "warn" && l.msg.includes("peer"))).toEqual([])
    expect(fatal[0]?.msg).toBe(
      `the coordinator at ${c.url} refused this host's token (ENGRAM_HOST_TOKEN): it is wrong, the host ${hostId} (ENGRAM_HOST_ID) is not registered, or its token was rotated. Register the host (engram hosts add) or rotate its token, and start the agent with the token it prints`,
    )
  })

  it("another host's token is named as such, exit 3", async () => {
    const mine = "main-mine"
    const other = await api(c.url, adminToken).call("POST", "/v1/hosts", { id: "main-other" })
    expect((await api(c.url, adminToken).call("POST", "/v1/hosts", { id: mine })).status).toBe(201)
    const r = await runToEnd(mine, other.body.token as string)
    expect(r.code).toBe(3)
    expect(r.output).toContain(`the token in ENGRAM_HOST_TOKEN does not belong to host ${mine} (ENGRAM_HOST_ID)`)
  })

  it("with its token it says ready, and SIGTERM ends it with exit 0", async () => {
    const hostId = "main-good"
    const created = await api(c.url, adminToken).call("POST", "/v1/hosts", { id: hostId })
    const agent = await spawnAgent({ hostId, port: await freePort(), coordinatorUrl: c.url, hostToken: created.body.token as string, peers: "" })
    const exited = new Promise<number | null>((r) => agent.child.once("exit", (code) => r(code)))
    agent.child.kill("SIGTERM")
    expect(await exited).toBe(0)
  })
})
