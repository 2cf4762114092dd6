/**
 * In-doubt moves under faults, end to end (SPEC §13): a real coordinator and two agent processes
 * on the simulated runtime. Right after a move's final round is recorded, the source or the
 * target is frozen (SIGSTOP) for twice the stale window, then continued. Every try: the session
 * is never `lost` meanwhile, the move ends (committed, or aborted with the guest on the source),
 * and the guest runs exactly once, on the host the store places it on. `ENGRAM_FAULT_TRIES`
 * (default 4 per frozen side) sets how many tries.
 */
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { Limits } from "@engram/core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type AgentProcess, type Api, api, freePort, sleep, spawnAgent, until } from "./support/E2e.js"

const STALE_MS = 2000
const TRIES = Number(process.env["ENGRAM_FAULT_TRIES"] ?? 4)
let coordinator: RunningCoordinator
let admin: Api
const agents: Record<string, AgentProcess> = {}

/* eslint-disable @typescript-eslint/no-explicit-any -- answers are read loosely; each field read is named */
const session = async (id: string): Promise<any> => (await admin.call("GET", `/v1/sessions/${id}`)).body
const runningOn = async (id: string) => {
  const on: string[] = []
  for (const a of Object.values(agents)) if ((await a.status()).vms.some((v: any) => v.vmId === id && v.status === "running")) on.push(a.hostId)
  return on
}
/* eslint-enable @typescript-eslint/no-explicit-any */

beforeAll(async () => {
  coordinator = await startCoordinator({
    config: {
      port: 0,
      dataDir: mkdtempSync(join(tmpdir(), "engram-indoubt-")),
      adminToken: "indoubt-admin-token-0123456789",
      limits: { ...Limits.defaults, heartbeatStaleWindowMs: STALE_MS, reaperIntervalMs: 200 },
      moveTimeoutMs: 20_000,
    },
    logLevel: "Error",
  })
  admin = api(coordinator.url, coordinator.adminToken)
  const ids = ["a", "b"]
  const ports = await Promise.all(ids.map(() => freePort()))
  const peers = ids.map((id, i) => `${id}=http://127.0.0.1:${ports[i]}`).join(",")
  for (const [i, id] of ids.entries()) {
    const created = await admin.call("POST", "/v1/hosts", { id })
    expect(created.status).toBe(201)
    agents[id] = await spawnAgent({
      hostId: id,
      port: ports[i]!,
      coordinatorUrl: coordinator.url,
      hostToken: created.body.token,
      peers,
      env: {
        ENGRAM_HEARTBEAT_STALE_WINDOW_MS: String(STALE_MS),
        ENGRAM_AGENT_POLL_WAIT_MS: "1000",
        ENGRAM_AGENT_RETRY_MS: "200",
        ENGRAM_AGENT_REPORT_MS: "1000",
        ENGRAM_AGENT_REPORT_RUNNING_AFTER_MS: "1000",
        ENGRAM_AGENT_STAGING_GRACE_MS: "3000",
        // A slow commit on the target: the window after the final round is seconds wide.
        ENGRAM_SIM: JSON.stringify({ commitMs: 2500 }),
      },
    })
  }
  await until("hosts measured", async () => (await admin.call("GET", "/v1/hosts")).body.items, (hs: { measured: boolean }[]) => hs.length === 2 && hs.every((h) => h.measured))
}, 240_000)

afterAll(async () => {
  for (const a of Object.values(agents)) a.child.kill("SIGCONT")
  await Promise.all(Object.values(agents).map((a) => a.kill("SIGTERM")))
  await coordinator?.stop()
}, 60_000)

describe("a peer frozen right after the final round is recorded", () => {
  for (const frozen of ["source", "target"] as const) {
    it(`the ${frozen} frozen for twice the stale window, ${TRIES} tries: nothing lost, every move ends, the guest runs once`, async () => {
      const outcomes: string[] = []
      for (let i = 0; i < TRIES; i++) {
        // Alternate directions so each try starts from a host with room.
        const [src, dst] = i % 2 === 0 ? ["a", "b"] : ["b", "a"]
        const id = `${frozen}-${i}`
        expect((await admin.call("POST", "/v1/sessions", { id, memMib: 512, vcpus: 1, affinity: [src] })).body.hostId).toBe(src)
        await until(`${id} running`, () => session(id), (s) => s?.state === "running")
        // A wide budget: the learned commit allowance grows with the slow simulated commits; the guard is not under test here.
        const moving = admin.call("POST", `/v1/sessions/${id}/move`, { targetHostId: dst, maxDowntimeMs: 60_000 })
        // The move's final round recorded: freeze the peer at once.
        type Seen = { id: string; sessionId: string; state: string; rounds: { kind: string }[] }
        let move: Seen | undefined
        for (const deadline = Date.now() + 30_000; Date.now() < deadline; await sleep(10)) {
          move = ((await admin.call("GET", `/v1/moves?hostId=${src}`)).body.items as Seen[]).find((m) => m.sessionId === id)
          if (move?.rounds.some((r) => r.kind === "final") === true) break
        }
        expect(move?.state, `${id}: the move was not caught pending after its final round: ${JSON.stringify(move)}`).toBe("pending")
        const victim = agents[frozen === "source" ? src : dst]!
        victim.child.kill("SIGSTOP")
        try {
          // Past the stale window, twice: the session is never lost, the move never reclaimed.
          const until2 = Date.now() + 2 * STALE_MS + 500
          while (Date.now() < until2) {
            expect(["moving", "running"]).toContain((await session(id)).state)
            await sleep(100)
          }
        } finally {
          victim.child.kill("SIGCONT")
        }
        await moving
        const ended = await until(`${id}'s move ends`, async () => (await admin.call("GET", `/v1/moves/${move!.id}`)).body, (m) => m.state !== "pending", 60_000)
        const s = await until(`${id} runs`, () => session(id), (x) => x?.state === "running", 30_000)
        expect(s.hostId).toBe(ended.state === "committed" ? dst : src)
        const on = await until(`${id} runs on one agent`, () => runningOn(id), (hosts) => hosts.length === 1 && hosts[0] === s.hostId, 30_000)
        expect(on).toEqual([s.hostId])
        outcomes.push(`${ended.state}${ended.phases === null ? " (resolved)" : ""}`)
        expect((await admin.call("DELETE", `/v1/sessions/${id}`)).status).toBe(200)
        await until(`${id} gone from the agents`, () => runningOn(id), (hosts) => hosts.length === 0, 30_000)
      }
      console.log(`in-doubt, ${frozen} frozen: ${outcomes.join(", ")}`)
      expect(outcomes).toHaveLength(TRIES)
    }, 60_000 + TRIES * 30_000)
  }
})
