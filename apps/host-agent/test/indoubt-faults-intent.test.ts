/**
 * In-doubt moves under faults, end to end (SPEC §13): a real coordinator and two agent processes
 * on the simulated runtime. A move's source records its intent (the point of no return) with
 * the guest still running, pauses 1.5 s later (`pauseDelayMs`, as QEMU stops the guest at its
 * next iteration), sends, and records the final round's figures once the target (a 2.5 s
 * commit) runs the guest. The source or the target is struck at one of two points: **between the
 * intent and the pause**, or **after the pause, before the final round's record** (the source's
 * copy paused, the target committing): frozen (SIGSTOP) for twice the stale window, then
 * continued; or killed (SIGKILL) and started again on its own state directory. Every try: the
 * session is never `lost` meanwhile, the move ends (committed, or aborted with the guest on the
 * source), and the guest runs exactly once, on the host the store places it on. The whole run is
 * recorded (the client's creates and ends, the agents' reports of the guests they run and the
 * guests gone from them, the moves' outcomes) and the fault suite's checker reads it: among its
 * rules, no guest an agent reported running was destroyed without an end or abort.
 * `ENGRAM_FAULT_TRIES` (default 1 per point, side and fault) sets how many tries.
 *
 * With `ENGRAM_AGENT_MOVE_INTENT=1` on the agents; **not in the default run** (set
 * `ENGRAM_FAULT_INTENT=1`): its strike points are real-time windows (the 1.5 s between the intent
 * and the pause, the 2.5 s commit), which a loaded machine can miss. The states they reach are
 * covered deterministically on the TestClock in `MoveGuard.test.ts` (the intent's describes).
 * The default run's `indoubt-faults.test.ts` covers the default protocol (no intent).
 */
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { Limits } from "@engram/core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
// The fault suite's history and checker, by path: @engram/faults depends on this package.
import { check, describe as describeViolations } from "../../../tooling/faults/src/Checker.js"
import { GuestLog, Recorder } from "../../../tooling/faults/src/History.js"
import { observeApi, watchGuests } from "../../../tooling/faults/src/Observe.js"
import { type AgentProcess, type Api, api, freePort, sleep, spawnAgent, until } from "./support/E2e.js"

const runIntentFaults = process.env["ENGRAM_FAULT_INTENT"] === "1"
const STALE_MS = 2000
const TRIES = Number(process.env["ENGRAM_FAULT_TRIES"] ?? 1)
let coordinator: RunningCoordinator
let admin: Api
let client: Recorder
const agents: Record<string, AgentProcess> = {}
/** How each agent was started: a killed agent is started again the same way, on the same directory. */
const spawns: Record<string, Parameters<typeof spawnAgent>[0]> = {}
const guests = new GuestLog()
let watcher: { readonly stop: () => Promise<void> } | undefined

/* eslint-disable @typescript-eslint/no-explicit-any -- answers are read loosely; each field read is named */
const session = async (id: string): Promise<any> => (await admin.call("GET", `/v1/sessions/${id}`)).body
const runningOn = async (id: string) => {
  const on: string[] = []
  for (const a of Object.values(agents)) if ((await a.status()).vms.some((v: any) => v.vmId === id && v.status === "running")) on.push(a.hostId)
  return on
}
/** The agents that hold a copy of the guest, running or not. */
const heldOn = async (id: string) => {
  const on: string[] = []
  for (const a of Object.values(agents)) if ((await a.status()).vms.some((v: any) => v.vmId === id)) on.push(`${a.hostId} (${JSON.stringify((await a.status()).vms.find((v: any) => v.vmId === id))})`)
  return on
}
/* eslint-enable @typescript-eslint/no-explicit-any */

beforeAll(async () => {
  if (!runIntentFaults) return
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
    spawns[id] = {
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
        ENGRAM_AGENT_MOVE_INTENT: "1",
        ENGRAM_AGENT_STAGING_GRACE_MS: "3000",
        // Seconds-wide windows: between the intent and the pause (1.5 s), and after the pause
        // (the target's commit, 2.5 s) before the final round's record.
        ENGRAM_SIM: JSON.stringify({ commitMs: 2500, pauseDelayMs: 1500 }),
      },
    }
    agents[id] = await spawnAgent(spawns[id])
    spawns[id] = { ...spawns[id], dir: agents[id].dir }
  }
  client = new Recorder(coordinator.url, coordinator.adminToken, 30_000)
  watcher = watchGuests(
    () => Object.values(agents).map((a) => ({ hostId: a.hostId, guests: async () => (await a.status()).vms })),
    guests,
  )
  await until("hosts measured", async () => (await admin.call("GET", "/v1/hosts")).body.items, (hs: { measured: boolean }[]) => hs.length === 2 && hs.every((h) => h.measured))
}, 240_000)

afterAll(async () => {
  await watcher?.stop()
  for (const a of Object.values(agents)) a.child.kill("SIGCONT")
  await Promise.all(Object.values(agents).map((a) => a.kill("SIGTERM")))
  await coordinator?.stop()
}, 60_000)

/** Stops the victim for twice the stale window, then continues it. */
const freeze = async (victim: AgentProcess, watch: () => Promise<void>) => {
  victim.child.kill("SIGSTOP")
  try {
    for (const until2 = Date.now() + 2 * STALE_MS + 500; Date.now() < until2; await sleep(100)) await watch()
  } finally {
    victim.child.kill("SIGCONT")
  }
}

/** Kills the victim at once and starts it again on its own state directory (same port, same token). */
const killAndRestart = async (victim: AgentProcess, watch: () => Promise<void>) => {
  const exited = new Promise<void>((r) => (victim.child.exitCode !== null || victim.child.signalCode !== null ? r() : victim.child.once("exit", () => r())))
  victim.child.kill("SIGKILL")
  await exited
  await watch()
  const restarting = spawnAgent(spawns[victim.hostId]!)
  // Watch while it starts: a restart on a busy machine may take longer than the stale window.
  let started = false
  void restarting.then(() => (started = true), () => (started = true))
  while (!started) {
    await watch()
    await sleep(100)
  }
  agents[victim.hostId] = await restarting
  await watch()
}

const faults = { frozen: freeze, killed: killAndRestart } as const

/** The sessions of one test: `<point>-<side>-<fault>-<try>`. */
const id0 = (point: string, side: string, fault: string) => `${point.startsWith("between") ? "intent" : "paused"}-${side}-${fault}-`

type Seen = { id: string; sessionId: string; state: string; rounds: { kind: string }[] }
const kinds = (m: Seen | undefined) => (m?.rounds ?? []).map((r) => r.kind)
/* eslint-disable-next-line @typescript-eslint/no-explicit-any -- the agent's status, read loosely */
const guestOn = async (hostId: string, id: string): Promise<any> => (await agents[hostId]!.status()).vms.find((v: { vmId: string }) => v.vmId === id)

/**
 * Where a try strikes: once the coordinator holds the move's intent while the source's guest
 * still runs; or once the source's guest is paused for the move while the final round is not
 * recorded yet. Answers the move as seen then.
 */
const points = {
  "between the intent and the pause": async (src: string, id: string): Promise<Seen | undefined> => {
    let move: Seen | undefined
    for (const deadline = Date.now() + 30_000; Date.now() < deadline; await sleep(10)) {
      move = ((await admin.call("GET", `/v1/moves?hostId=${src}`)).body.items as Seen[]).find((m) => m.sessionId === id)
      if (kinds(move).includes("intent")) break
    }
    expect(kinds(move), `${id}: the intent was not seen: ${JSON.stringify(move)}`).toContain("intent")
    // The pause follows the intent by 1.5 s: struck at once, the source's guest still runs (not
    // asserted: a status read on a loaded machine may take longer than that).
    return move
  },
  "after the pause, before the final round's record": async (src: string, id: string): Promise<Seen | undefined> => {
    for (const deadline = Date.now() + 30_000; Date.now() < deadline; await sleep(10)) {
      const g = await guestOn(src, id)
      if (g?.status === "paused" && g.moveId === null) break
    }
    const move = ((await admin.call("GET", `/v1/moves?hostId=${src}`)).body.items as Seen[]).find((m) => m.sessionId === id)
    expect(kinds(move), `${id}: paused past the intent, before the final round: ${JSON.stringify(move)}`).toContain("intent")
    expect(kinds(move)).not.toContain("final")
    return move
  },
} as const

describe.skipIf(!runIntentFaults)("a peer frozen or killed past the move's intent (ENGRAM_FAULT_INTENT=1)", () => {
  for (const [point, reach] of Object.entries(points)) {
    for (const [fault, inject] of Object.entries(faults)) {
      for (const side of ["source", "target"] as const) {
        it(`${point}: the ${side} ${fault}, ${TRIES} tries: nothing lost, every move ends, the guest runs once`, async () => {
          const outcomes: string[] = []
          const startedMs = Date.now()
          for (let i = 0; i < TRIES; i++) {
            // Alternate directions so each try starts from a host with room.
            const [src, dst] = i % 2 === 0 ? ["a", "b"] : ["b", "a"]
            const id = `${id0(point, side, fault)}${i}`
            const created = await client.call("create", id, "POST", "/v1/sessions", { id, memMib: 512, vcpus: 1, affinity: [src] })
            expect((created.response as { hostId?: string }).hostId).toBe(src)
            await until(`${id} running`, () => session(id), (s) => s?.state === "running")
            // A wide budget: the learned commit allowance grows with the slow simulated commits; the guard is not under test here.
            const moving = admin.call("POST", `/v1/sessions/${id}/move`, { targetHostId: dst, maxDowntimeMs: 60_000 })
            const move = await reach(src!, id)
            expect(move?.state, `${id}: the move was not caught pending: ${JSON.stringify(move)}`).toBe("pending")
            // Meanwhile, past the stale window: the session is never lost, the move never reclaimed.
            await inject(agents[side === "source" ? src : dst]!, async () => {
              expect(["moving", "running"]).toContain((await session(id)).state)
            })
            await moving
            const ended = await until(`${id}'s move ends`, async () => (await admin.call("GET", `/v1/moves/${move!.id}`)).body, (m) => m.state !== "pending", 60_000)
            guests.record({
              kind: ended.state === "committed" ? "move_committed" : "move_aborted",
              moveId: ended.id,
              sessionId: id,
              sourceHostId: ended.sourceHostId,
              targetHostId: ended.targetHostId,
              atMs: ended.endedAt,
            })
            const s = await until(`${id} runs`, () => session(id), (x) => x?.state === "running", 30_000)
            expect(s.hostId).toBe(ended.state === "committed" ? dst : src)
            const on = await until(`${id} runs on one agent`, () => runningOn(id), (hosts) => hosts.length === 1 && hosts[0] === s.hostId, 30_000)
            expect(on).toEqual([s.hostId])
            outcomes.push(`${ended.state}${ended.phases === null ? " (resolved)" : ""}`)
            expect((await client.end(id)).status).toBe(200)
            await until(`${id} gone from the agents`, () => heldOn(id), (hosts) => hosts.length === 0, 30_000)
          }
          console.log(`in-doubt, ${point}, ${side} ${fault}: ${TRIES} tries in ${Math.round((Date.now() - startedMs) / 1000)} s: ${outcomes.join(", ")}`)
          expect(outcomes).toHaveLength(TRIES)
          // The whole run so far, through the checker: stored once, ended when acknowledged, sums, nothing twice, no destroy without an end or abort.
          const running = await Promise.all(Object.values(agents).map(async (a) => ({ hostId: a.hostId, sessionIds: ((await a.status()).vms as { vmId: string }[]).map((v) => v.vmId) })))
          const violations = check(client.ops, { ...(await observeApi(coordinator.url, coordinator.adminToken)), running }, guests.events)
          expect(violations, describeViolations(violations)).toEqual([])
          // The rule had something to read: each try's guest was seen running and seen destroyed.
          for (const kind of ["guest_running", "guest_destroyed"] as const) {
            expect(guests.events.filter((e) => e.kind === kind && e.sessionId.startsWith(id0(point, side, fault))).length, kind).toBeGreaterThanOrEqual(TRIES)
          }
        }, 120_000 + TRIES * 90_000)
      }
    }
  }
})
