/**
 * The in-doubt fault run both `indoubt-faults*.test.ts` files share (SPEC §13): a real
 * coordinator and two agent processes on the simulated runtime. Each try creates a session, moves
 * it, waits for the strike point, then freezes (SIGSTOP for twice the stale window, then SIGCONT)
 * or kills (SIGKILL, then a start on its own state directory) the source or the target. Every
 * try: the session is never `lost` meanwhile, the move ends (committed, or aborted with the guest
 * on the source), and the guest runs exactly once, on the host the store places it on. The whole
 * run is recorded (the client's creates and ends, the agents' reports of the guests they run and
 * the guests gone from them, the moves' outcomes) and the fault suite's checker reads it.
 */
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { Limits } from "@engram/core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
// The fault suite's history and checker, by path: @engram/faults depends on this package.
import { check, describe as describeViolations } from "../../../../tooling/faults/src/Checker.js"
import { GuestLog, Recorder } from "../../../../tooling/faults/src/History.js"
import { observeApi, watchGuests } from "../../../../tooling/faults/src/Observe.js"
import { type AgentProcess, type Api, api, registerHosts, sleep, spawnAgent, until } from "./E2e.js"

/**
 * The agents' heartbeat stale window: a frozen agent stays stopped for twice it. 4 s, not less:
 * the agent that is not frozen must not go stale itself (heartbeats every third of it) when
 * the whole suite starves its process on a busy machine for a second or two.
 */
export const STALE_MS = 4000

/** A move as `GET /v1/moves` answers it, the fields a strike point reads. */
export type SeenMove = { id: string; sessionId: string; state: string; rounds: { kind: string }[] }

/** The kinds of a move's recorded rounds, in order. */
export const roundKinds = (m: SeenMove | undefined) => (m?.rounds ?? []).map((r) => r.kind)

/** What a strike point may read: the admin API and the agents as they run now (a killed one is replaced). */
export interface FaultRun {
  readonly admin: Api
  readonly agents: Readonly<Record<string, AgentProcess>>
  /** The move of session `id` whose source is `src`, as the coordinator holds it now. */
  readonly moveOf: (src: string, id: string) => Promise<SeenMove | undefined>
  /** That move once it holds a round of `kind` (read every 10 ms, for up to 30 s); as last read if it never does. */
  readonly moveWithRound: (src: string, id: string, kind: string) => Promise<SeenMove | undefined>
}

/** Where a try strikes: resolves once the move reached it, with the move as seen then (asserted pending). */
export interface StrikePoint {
  /** Put before each case's name (`"<label>: the source frozen, …"`); none for a file with one point. */
  readonly label?: string
  /** The sessions of this point's cases are named `<sessions><side>-<fault>-<try>`. */
  readonly sessions: string
  readonly reach: (run: FaultRun, src: string, id: string) => Promise<SeenMove | undefined>
}

/**
 * Registers the fault run as one `describe` (skipped, with its hooks, unless `enabled`): one case
 * per strike point, fault (frozen, killed) and side (source, target), each of `tries` tries.
 */
export const inDoubtFaultRun = (o: {
  readonly title: string
  readonly enabled?: boolean
  readonly tries: number
  readonly points: readonly StrikePoint[]
  /** The agents' environment beyond the fast timers every run uses (say, `ENGRAM_SIM`, `ENGRAM_AGENT_MOVE_INTENT`). */
  readonly agentEnv: Readonly<Record<string, string>>
}) =>
  describe.skipIf(o.enabled === false)(o.title, () => {
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
    const moveOf = async (src: string, id: string) => ((await admin.call("GET", `/v1/moves?hostId=${src}`)).body.items as SeenMove[]).find((m) => m.sessionId === id)
    const moveWithRound = async (src: string, id: string, kind: string) => {
      let move: SeenMove | undefined
      for (const deadline = Date.now() + 30_000; Date.now() < deadline; await sleep(10)) {
        move = await moveOf(src, id)
        if (roundKinds(move).includes(kind)) break
      }
      // A try that never saw its strike point would strike at an unknown one and prove nothing.
      expect(roundKinds(move), `${id}'s move reached its ${kind} round`).toContain(kind)
      return move
    }

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
      const hosts = await registerHosts(admin, coordinator.url, ids)
      for (const id of ids) {
        const spawn = {
          ...hosts[id]!,
          env: {
            ENGRAM_HEARTBEAT_STALE_WINDOW_MS: String(STALE_MS),
            ENGRAM_AGENT_POLL_WAIT_MS: "1000",
            ENGRAM_AGENT_RETRY_MS: "200",
            ENGRAM_AGENT_REPORT_MS: "1000",
            ENGRAM_AGENT_REPORT_RUNNING_AFTER_MS: "1000",
            ENGRAM_AGENT_STAGING_GRACE_MS: "3000",
            ...o.agentEnv,
          },
        }
        const agent = await spawnAgent(spawn)
        agents[id] = agent
        spawns[id] = { ...spawn, dir: agent.dir }
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

    for (const point of o.points) {
      for (const [fault, inject] of Object.entries(faults)) {
        for (const side of ["source", "target"] as const) {
          const sessions = `${point.sessions}${side}-${fault}-`
          it(`${point.label === undefined ? "" : `${point.label}: `}the ${side} ${fault}, ${o.tries} tries: nothing lost, every move ends, the guest runs once`, async () => {
            const outcomes: string[] = []
            const startedMs = Date.now()
            for (let i = 0; i < o.tries; i++) {
              // Alternate directions so each try starts from a host with room.
              const [src, dst] = i % 2 === 0 ? ["a", "b"] : ["b", "a"]
              const id = `${sessions}${i}`
              const created = await client.call("create", id, "POST", "/v1/sessions", { id, memMib: 512, vcpus: 1, affinity: [src] })
              expect((created.response as { hostId?: string }).hostId).toBe(src)
              await until(`${id} running`, () => session(id), (s) => s?.state === "running")
              // A wide budget: the learned commit allowance grows with the slow simulated commits; the guard is not under test here.
              const moving = admin.call("POST", `/v1/sessions/${id}/move`, { targetHostId: dst, maxDowntimeMs: 60_000 })
              const move = await point.reach({ admin, agents, moveOf, moveWithRound }, src!, id)
              expect(move?.state, `${id}: the move was not caught pending at the strike point: ${JSON.stringify(move)}`).toBe("pending")
              // Meanwhile, past the stale window: the session is never lost, the move never reclaimed.
              await inject(agents[side === "source" ? src! : dst!]!, async () => {
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
              // The watcher reads the agents on its own period: its read that follows the destroy may still be on its way.
              await until(`${id} seen destroyed by the guest watcher`, async () => guests.events.some((e) => e.kind === "guest_destroyed" && e.sessionId === id), (seen) => seen, 15_000)
            }
            console.log(`in-doubt, ${point.label === undefined ? "" : `${point.label}, `}${side} ${fault}: ${o.tries} tries in ${Math.round((Date.now() - startedMs) / 1000)} s: ${outcomes.join(", ")}`)
            expect(outcomes).toHaveLength(o.tries)
            // The whole run so far, through the checker: stored once, ended when acknowledged, sums, nothing twice, no destroy without an end or abort.
            const running = await Promise.all(Object.values(agents).map(async (a) => ({ hostId: a.hostId, sessionIds: ((await a.status()).vms as { vmId: string }[]).map((v) => v.vmId) })))
            const violations = check(client.ops, { ...(await observeApi(coordinator.url, coordinator.adminToken)), running }, guests.events)
            expect(violations, describeViolations(violations)).toEqual([])
            // The rule had something to read: each try's guest was seen running and seen destroyed.
            for (const kind of ["guest_running", "guest_destroyed"] as const) {
              expect(guests.events.filter((e) => e.kind === kind && e.sessionId.startsWith(sessions)).length, kind).toBeGreaterThanOrEqual(o.tries)
            }
          }, 120_000 + o.tries * 90_000)
        }
      }
    }
  })
