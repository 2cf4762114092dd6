/**
 * Agents find each other through the coordinator, end to end: a real coordinator and two agent
 * processes (simulated runtime) over HTTP with no `ENGRAM_PEERS`. Each agent advertises the URL
 * of its peer server with its reports (derived from `ENGRAM_AGENT_HOST` and its port); the
 * coordinator gives the target's to the source with the move, and the move commits.
 */
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type AgentProcess, type Api, api, registerHosts, spawnAgent, until } from "./support/E2e.js"

let coordinator: RunningCoordinator
let admin: Api
const agents: Record<string, AgentProcess> = {}
const ports: Record<string, number> = {}

const session = async (id: string) => (await admin.call("GET", `/v1/sessions/${id}`)).body

beforeAll(async () => {
  coordinator = await startCoordinator({
    config: { port: 0, dataDir: mkdtempSync(join(tmpdir(), "engram-peers-e2e-")), adminToken: "e2e-admin-token-0123456789", moveTimeoutMs: 20_000 },
    logLevel: "Warn",
  })
  admin = api(coordinator.url, coordinator.adminToken)
  const hosts = await registerHosts(admin, coordinator.url, ["a", "b"])
  for (const [id, host] of Object.entries(hosts)) {
    ports[id] = host.port
    // One at a time: tsx compiles each on start. No peer list: the coordinator tells.
    agents[id] = await spawnAgent({ ...host, peers: "", env: { ENGRAM_AGENT_POLL_WAIT_MS: "5000", ENGRAM_AGENT_HOST: "127.0.0.1" } })
  }
  await until("hosts measured", async () => (await admin.call("GET", "/v1/hosts")).body.items, (hs: { measured: boolean }[]) => hs.length === 2 && hs.every((h) => h.measured))
}, 240_000)

afterAll(async () => {
  await Promise.all(Object.values(agents).map((a) => a.kill("SIGTERM")))
  await coordinator?.stop()
}, 60_000)

describe("agents find each other through the coordinator (no ENGRAM_PEERS)", () => {
  it("each host shows the peer URL its agent derived and reported", async () => {
    for (const id of ["a", "b"]) expect((await admin.call("GET", `/v1/hosts/${id}`)).body.peerUrl).toBe(`http://127.0.0.1:${ports[id]}`)
  })

  it("a live move between the two agents commits: the source reached the target at the URL the coordinator gave", async () => {
    expect((await admin.call("POST", "/v1/sessions", { id: "s1", memMib: 512, vcpus: 1, affinity: ["a"] })).body.hostId).toBe("a")
    await until("s1 running", () => session("s1"), (s) => s?.state === "running")
    const moved = await admin.call("POST", "/v1/sessions/s1/move", { targetHostId: "b", maxDowntimeMs: 10_000 })
    expect([moved.status, moved.body.move?.state ?? moved.body]).toEqual([200, "committed"])
    await until(
      "s1 running on b, its source copy gone",
      async () => [await session("s1"), await agents.a!.status()] as const,
      ([s, src]) => s.state === "running" && s.hostId === "b" && src.vms.length === 0 && src.pendingCommits.length === 0,
    )
  }, 90_000)
})
