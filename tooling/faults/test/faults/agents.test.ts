// Host agents as real processes on the simulated runtime. One is SIGKILLed: its reservations stop
// being heartbeated, the reaper reclaims them once stale (SPEC §3) and its sessions become `lost`,
// while the other hosts' sessions keep running. Another is paused with SIGSTOP (a partition): the
// same happens to its sessions; after SIGCONT it stops the VMs of its lost sessions (the store's
// view wins) and takes new placements again. Then the checker: acknowledged creates stored once,
// no host over capacity, the maintained sums equal to the ledger, and no session runs twice or
// anywhere the store does not place it.
import { freshDatabase, type TestDatabase } from "@engram/test-pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { History, Load, Observe, Processes } from "../../src/index.js"
import { ADMIN_TOKEN, capacities, expectNoViolations, registerHosts } from "./fixture.js"

// Short windows so the scenario takes seconds: a reservation is stale 4 s after its last
// heartbeat (the agents heartbeat every third of that), the reaper runs every 500 ms.
const STALE_MS = "4000"

let db: TestDatabase
let coordinator: Processes.CoordinatorProcess
const agents = new Map<string, Processes.AgentProcess>()

beforeAll(async () => {
  db = await freshDatabase({ prefix: "faults_agents" })
  coordinator = await Processes.startCoordinatorProcess({
    ENGRAM_DATABASE_URL: db.url,
    ENGRAM_ADMIN_TOKEN: ADMIN_TOKEN,
    ENGRAM_DATA_DIR: Processes.tempDir("agents"),
    ENGRAM_HEARTBEAT_STALE_WINDOW_MS: STALE_MS,
    ENGRAM_REAPER_INTERVAL_MS: "500",
  })
  // Registered without a report: each agent's first report makes its host take placements.
  const tokens = await registerHosts(coordinator.url, "agent", 3, 0, false)
  await Promise.all(
    [...tokens].map(async ([hostId, hostToken]) => {
      const agent = await Processes.startAgentProcess({
        hostId,
        hostToken,
        coordinatorUrl: coordinator.url,
        totalMib: 4096,
        env: { ENGRAM_HEARTBEAT_STALE_WINDOW_MS: STALE_MS, ENGRAM_AGENT_REPORT_MS: "1000", ENGRAM_AGENT_POLL_WAIT_MS: "1000", ENGRAM_AGENT_RETRY_MS: "200" },
      })
      agents.set(hostId, agent)
    }),
  )
})

afterAll(async () => {
  await Processes.killAll()
  await db?.drop()
})

/* eslint-disable @typescript-eslint/no-explicit-any -- answers are read loosely; each field read is named */
const admin = (method: string, path: string, body?: unknown): Promise<any> =>
  fetch(`${coordinator.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${ADMIN_TOKEN}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  }).then(async (r) => ({ status: r.status, ...((await r.json()) as object) }))
/* eslint-enable @typescript-eslint/no-explicit-any */

/** Waits (long-polls) until session `id` is in `state`. */
const waitFor = async (id: string, state: string) => {
  for (;;) {
    const r = await admin("GET", `/v1/sessions/${id}/wait?state=${state}&timeoutMs=30000`)
    if (r.status === 200) return
    if (r.status !== 408) throw new Error(`session ${id} never reaches ${state}: ${JSON.stringify(r)}`)
  }
}

const runningIds = async (agent: Processes.AgentProcess) => ((await agent.vms()) ?? []).filter((v) => v.status === "running").map((v) => v.vmId)

describe("agents SIGKILLed and partitioned", () => {
  it("a killed agent's and a paused agent's sessions become lost by heartbeat expiry; the paused one, continued, stops them and takes placements again", async () => {
    const agent = (id: string) => {
      const a = agents.get(id)
      if (a === undefined) throw new Error(`no agent ${id}`)
      return a
    }
    const [killed, paused, healthy] = [agent("agent-0"), agent("agent-1"), agent("agent-2")]
    await Load.until("every agent's first report", async () => {
      const hosts = await admin("GET", "/v1/hosts")
      return hosts.items.every((h: { measured: boolean }) => h.measured)
    })
    const caps = await capacities(coordinator.url)
    const recorder = new History.Recorder(coordinator.url, ADMIN_TOKEN)
    const observer = Observe.sqlObserver(db.url, caps)
    const sampler = Observe.startSampler(observer.sample)
    try {
      // Four sessions on each host, each started by its agent.
      const on = new Map<string, string[]>()
      for (const a of [killed, paused, healthy]) {
        const ids: string[] = []
        for (let i = 0; i < 4; i++) {
          const id = `s-${a.hostId}-${i}`
          const op = await recorder.call("create", id, "POST", "/v1/sessions", { id, memMib: 512, vcpus: 1, affinity: [a.hostId] })
          expect(op.status, JSON.stringify(op.response)).toBe(201)
          expect((op.response as { hostId: string }).hostId).toBe(a.hostId)
          ids.push(id)
        }
        on.set(a.hostId, ids)
      }
      for (const ids of on.values()) for (const id of ids) await waitFor(id, "running")

      // SIGKILL: the host's reservations go stale and are reclaimed; its sessions are lost.
      await killed.kill("SIGKILL")
      for (const id of on.get(killed.hostId)!) await waitFor(id, "lost")

      // SIGSTOP: a partition; the same happens to the paused host's sessions.
      paused.process.kill("SIGSTOP")
      for (const id of on.get(paused.hostId)!) await waitFor(id, "lost")
      // The healthy host's sessions kept running through both.
      for (const id of on.get(healthy.hostId)!) expect((await admin("GET", `/v1/sessions/${id}`)).state).toBe("running")

      // SIGCONT: the agent comes back, stops what the store no longer places on it, and serves.
      paused.process.kill("SIGCONT")
      await Load.until("the continued agent stops its lost sessions' VMs", async () => (await runningIds(paused)).length === 0, 60_000, 250)
      for (let i = 0; i < 3; i++) {
        const id = `s-${paused.hostId}-again-${i}`
        const op = await recorder.call("create", id, "POST", "/v1/sessions", { id, memMib: 512, vcpus: 1, affinity: [paused.hostId] })
        expect(op.status, JSON.stringify(op.response)).toBe(201)
        await waitFor(id, "running")
      }
      // Ending a lost session is allowed and frees nothing twice.
      expect((await recorder.end(on.get(killed.hostId)![0]!)).status).toBe(200)

      await sampler.stop()
      const running = await Promise.all([paused, healthy].map(async (a) => ({ hostId: a.hostId, sessionIds: await runningIds(a) })))
      expect(running.find((r) => r.hostId === paused.hostId)?.sessionIds.sort()).toEqual([0, 1, 2].map((i) => `s-${paused.hostId}-again-${i}`))
      expect(running.find((r) => r.hostId === healthy.hostId)?.sessionIds.sort()).toEqual(on.get(healthy.hostId))
      const observation = { ...(await observer.observe()), samples: sampler.samples, running }
      expect(observation.reservations.filter((r) => r.hostId === killed.hostId)).toEqual([])
      expectNoViolations(recorder.ops, observation)
    } finally {
      await sampler.stop()
      await observer.close()
    }
  })
})
