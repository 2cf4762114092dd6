/**
 * A fleet of agents that does not stampede: on the TestClock, with a seeded or fixed `Random`,
 * the agent's calls land where `Pacing` says. Failed polls back off (drawn, capped) and polls
 * answered for the cap start the back-off again (one answer among failures does not:
 * `Flapping.test.ts`), and a failed action's retry pass backs off while the
 * action keeps failing; a failure that carries the coordinator's `retryAfterMs` (a 429's or 503's)
 * is not tried again sooner, up to the back-off's cap; agents started at one instant heartbeat and
 * report at instants of their own, each heartbeat within one interval of the last send, whatever
 * the coordinator asked.
 */
import { assert, describe } from "@effect/vitest"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { ImageStore, SimRuntime } from "@engram/runtime"
import { Clock, Effect, Fiber, Random } from "effect"
import { TestClock } from "effect/testing"
import { type AgentConfig, makeAgent } from "../src/Agent.js"
import { CoordinatorError, type CoordinatorShape } from "../src/Coordinator.js"
import * as Credential from "../src/Credential.js"
import * as Pacing from "../src/Pacing.js"
import { defaultAgentConfig } from "../src/Host.js"
import { makeMoveTarget } from "../src/MoveTarget.js"
import * as PeerLink from "../src/PeerLink.js"
import { makeResidents } from "../src/Residents.js"
import { type FakeCoordinator, makeFakeCoordinator } from "./support/FakeCoordinator.js"
import { effect, fixedRandom } from "./support/PatientClock.js"

const highest = 1 - 1e-9

interface Call {
  readonly op: string
  readonly atMs: number
  readonly waitMs?: number
  /** An assignments call's `since` (absent: none). */
  readonly since?: string
}

/**
 * The fake's client for `hostId`, every call's instant (the TestClock's) recorded; an op in
 * `failing` fails with its error, after `slow`'s ms for it on the TestClock (an HTTP round trip,
 * or a call hanging to its timeout).
 */
const watched = (fake: FakeCoordinator, hostId: string) => {
  const calls: Call[] = []
  const failing = new Map<string, CoordinatorError>()
  const slow = new Map<string, number>()
  const c = fake.client(hostId)
  const at = <A, E>(op: string, eff: Effect.Effect<A, E | CoordinatorError>, waitMs?: number, since?: string): Effect.Effect<A, E | CoordinatorError> =>
    Effect.flatMap(Clock.currentTimeMillis, (atMs) => {
      calls.push({ op, atMs, ...(waitMs === undefined ? {} : { waitMs }), ...(since === undefined ? {} : { since }) })
      const e = failing.get(op)
      return e === undefined ? eff : Effect.andThen(Effect.sleep(slow.get(op) ?? 0), Effect.fail(e))
    })
  const client: CoordinatorShape = {
    ...c,
    report: (r, active) => at("report", c.report(r, active)),
    heartbeat: at("heartbeat", c.heartbeat),
    assignments: (o) => at("assignments", c.assignments(o), o.waitMs, o.since),
    started: (id) => at("started", c.started(id)),
  }
  /** The instants of `op`'s calls (and of only the long-polls or only the fresh reads, by `waitMs`). */
  const times = (op: string, waitMs?: (w: number) => boolean) => calls.filter((x) => x.op === op && (waitMs === undefined || waitMs(x.waitMs ?? 0))).map((x) => x.atMs)
  return { client, failing, slow, times, calls }
}

const agentWith = (coordinator: CoordinatorShape, hostId: string, config: Partial<AgentConfig> = {}, images?: ImageStore.ImageStore) =>
  Effect.gen(function* () {
    const runtime = yield* SimRuntime.make({ startMs: 50 })
    const residents = yield* makeResidents(hostId, null, () => Effect.void)
    return yield* makeAgent(
      { ...defaultAgentConfig(hostId), ...config },
      {
        coordinator,
        runtime,
        measure: () => Effect.succeed({ totalMib: 16384, allocatableMib: 15360, totalVcpus: 8 }),
        residents,
        images: images ?? ImageStore.directory(mkdtempSync(join(tmpdir(), `engram-images-${hostId}-`))),
        link: PeerLink.inMemory(new Map()),
        target: yield* makeMoveTarget(hostId, runtime, residents),
      },
    )
  })

const gaps = (ts: readonly number[]) => ts.slice(1).map((t, i) => t - ts[i]!)
const away = (retryAfterMs?: number) => new CoordinatorError({ op: "any", status: 503, message: "the store is away", ...(retryAfterMs === undefined ? {} : { retryAfterMs }) })

describe("the assignments poll's version", () => {
  effect("the first poll reads at once, and a poll after a failure asks with the last version seen (a change during the outage answers at once)", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const a = watched(fake, "a")
      const agent = yield* agentWith(a.client, "a")
      yield* Effect.forkChild(agent.run)
      yield* TestClock.adjust("1500 millis")
      const polls = () => a.calls.filter((x) => x.op === "assignments" && (x.waitMs ?? 0) > 0)
      const first = a.calls.find((x) => x.op === "assignments")
      // Read at once (no long-poll without a version: it would wait for the next change).
      assert.deepStrictEqual(first, { op: "assignments", atMs: 0, waitMs: 0 })
      assert.isAbove(polls().length, 0)
      assert.isDefined(polls()[0]!.since, "the long-polls after it ask with the version read")
      // An outage: the polls fail, and the one after it still carries the last version seen.
      a.failing.set("assignments", away())
      const before = a.calls.length
      yield* TestClock.adjust("3 seconds")
      a.failing.delete("assignments")
      yield* TestClock.adjust("10 seconds")
      const after = a.calls.slice(before).filter((x) => x.op === "assignments")
      assert.isAbove(after.length, 1)
      assert.isTrue(
        after.every((x) => x.since !== undefined && (x.waitMs ?? 0) > 0),
        `every poll during and after the outage long-polls with a version: ${JSON.stringify(after.slice(0, 4))}`,
      )
    }).pipe(Effect.provideService(Random.Random, fixedRandom(highest))))
})

describe("retries back off, drawn and capped, and a healthy period starts them again", () => {
  effect("failed polls wait longer each time up to the cap (30 × ENGRAM_AGENT_RETRY_MS); polls answered for the cap reset the back-off", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const a = watched(fake, "a")
      // ENGRAM_AGENT_RETRY_MS=1000 (the default): cap 30 s. The highest draws show the ceilings.
      const agent = yield* agentWith(a.client, "a")
      a.failing.set("assignments", away())
      yield* Effect.forkChild(agent.run)
      yield* TestClock.adjust("61 seconds")
      assert.deepStrictEqual(gaps(a.times("assignments")), [2000, 4000, 8000, 16000, 30000], "each failed poll waits up to twice as long as the one before, at most 30 s")
      // The coordinator answers again: the poll at 90 s is answered, the next ones too (this fake
      // does not long-poll: 1 s apart, drawn in 0.5-1.5 s, the highest draw here).
      a.failing.delete("assignments")
      yield* TestClock.adjust("64500 millis")
      assert.deepStrictEqual(a.times("assignments").filter((t) => t >= 90_000 && t <= 95_000), [90_000, 90_000, 91_500, 93_000, 94_500])
      // A new outage after 35 s of answers (more than the cap) starts from the first delay again, not from the cap.
      a.failing.set("assignments", away())
      yield* TestClock.adjust("7 seconds")
      // (The last answered poll at 124.5 s, the first failing one at 126 s.)
      assert.deepStrictEqual(gaps(a.times("assignments").filter((t) => t >= 125_000)), [2000, 4000])
    }).pipe(Effect.provideService(Random.Random, fixedRandom(highest))))

  effect("a poll that hangs before it fails is not healthy time: answers between hung polls do not reset the back-off", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const a = watched(fake, "a")
      // Each failing poll hangs 35 s (more than the 30 s cap) before its failure comes back.
      a.slow.set("assignments", 35_000)
      const agent = yield* agentWith(a.client, "a")
      yield* Effect.forkChild(agent.run)
      // Alternate: after a poll is answered the next one hangs and fails; after it, one is answered again.
      const failedSends: number[] = []
      let seen = 0
      for (let step = 0; step < 600 && failedSends.length < 6; step++) {
        yield* TestClock.adjust("500 millis")
        const ts = a.times("assignments")
        if (ts.length === seen) continue
        seen = ts.length
        if (a.failing.has("assignments")) {
          failedSends.push(ts[ts.length - 1]!)
          a.failing.delete("assignments")
        } else a.failing.set("assignments", away())
      }
      const all = a.times("assignments")
      // The pause after each failure: from the failure's answer (its send + 35 s) to the next send.
      const pauses = failedSends.slice(0, 5).map((sent) => all.find((t) => t > sent)! - sent - 35_000)
      // Before, the hung poll's 35 s counted as healthy and every pause started from the first delay: [2000, 2000, …].
      assert.deepStrictEqual(pauses, [2000, 4000, 8000, 16000, 30000])
    }).pipe(Effect.provideService(Random.Random, fixedRandom(highest))))

  effect("an agent waiting on start for a coordinator that is away backs off too, and goes on once it answers", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const a = watched(fake, "a")
      a.failing.set("heartbeat", new CoordinatorError({ op: "heartbeat", status: null, message: "connection refused" }))
      const verified = yield* Effect.forkChild(Credential.verify(a.client, "a", "http://coordinator", 1000))
      yield* TestClock.adjust("31 seconds")
      assert.deepStrictEqual(gaps(a.times("heartbeat")), [2000, 4000, 8000, 16000])
      a.failing.delete("heartbeat")
      yield* TestClock.adjust("30 seconds")
      assert.strictEqual(a.times("heartbeat").length, 6)
      assert.isUndefined(yield* Fiber.join(verified))
    }).pipe(Effect.provideService(Random.Random, fixedRandom(highest))))

  effect("agents whose polls fail at one instant retry at instants of their own, each delay inside its bounds", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const hosts = ["a", "b", "c", "d"].map((id) => ({ id, w: watched(fake, id) }))
      for (const h of hosts) {
        h.w.failing.set("assignments", away())
        const agent = yield* agentWith(h.w.client, h.id)
        yield* Effect.forkChild(agent.run.pipe(Random.withSeed(`host-${h.id}`)))
      }
      yield* TestClock.adjust("3 minutes")
      const retries = hosts.map((h) => h.w.times("assignments"))
      for (const ts of retries) {
        gaps(ts).forEach((g, i) => {
          const ceiling = Math.min(30_000, 1000 * 2 ** (i + 1))
          assert.isTrue(g >= 1000 && g <= ceiling, `retry ${i + 1} waited ${g} ms, not in [1000, ${ceiling}]`)
        })
      }
      // Every host's first poll is at 0; after it, no two hosts poll at one instant.
      const later = retries.flatMap((ts) => ts.slice(1))
      assert.strictEqual(new Set(later).size, later.length, `instants shared by hosts: ${JSON.stringify(retries)}`)
    }))
})

describe("never sooner than the coordinator asked", () => {
  effect("a poll answered 503 with retryAfterMs waits at least that long, even on the lowest draw", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const a = watched(fake, "a")
      const agent = yield* agentWith(a.client, "a")
      a.failing.set("assignments", away(7000))
      yield* Effect.forkChild(agent.run)
      yield* TestClock.adjust("30 seconds")
      const ts = a.times("assignments")
      assert.isAtLeast(ts.length, 3)
      for (const g of gaps(ts)) assert.isAtLeast(g, 7000, `a poll came ${g} ms after a 503 that asked for 7000`)
    }).pipe(Effect.provideService(Random.Random, fixedRandom(0))))

  effect("a failed action's retry reads again no sooner than its 503 asked", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const a = watched(fake, "a")
      const agent = yield* agentWith(a.client, "a")
      yield* fake.addSession("s1", "a", 256)
      // The VM starts (50 ms), its acknowledgement is refused with a 503 that asks for 7 s.
      a.failing.set("started", away(7000))
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      // The start reads the image store (real file I/O) before its simulated 50 ms: step the clock until it asks.
      for (let i = 0; i < 2000 && a.times("started").length === 0; i++) {
        yield* Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, 1)))
        yield* TestClock.adjust("1 millis")
      }
      const [refusedAt] = a.times("started")
      assert.isDefined(refusedAt)
      a.failing.delete("started")
      yield* TestClock.adjust("20 seconds")
      const reads = a.times("assignments", (w) => w === 0)
      assert.isAtLeast(reads.length, 1)
      assert.isAtLeast(reads[0]! - refusedAt!, 7000, `the retry read at ${reads[0]} ms, the refusal at ${refusedAt} ms`)
      assert.deepStrictEqual(a.times("started").length, 2, "the acknowledgement was retried once, after the wait")
      assert.strictEqual((yield* fake.get).sessions.get("s1")?.state, "running")
    }).pipe(Effect.provideService(Random.Random, fixedRandom(0))))

  effect("a proxy's Retry-After: 3600 does not stop polls or the start-up check for an hour: the advice is honoured up to the back-off's cap (30 s, plus up to half)", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const a = watched(fake, "a")
      const hour = new CoordinatorError({ op: "any", status: 503, message: "proxy: upstream away", retryAfterMs: 3_600_000 })
      const agent = yield* agentWith(a.client, "a")
      a.failing.set("assignments", hour)
      yield* Effect.forkChild(agent.run)
      const verifier = watched(fake, "v")
      verifier.failing.set("heartbeat", hour)
      yield* Effect.forkChild(Credential.verify(verifier.client, "v", "http://coordinator", 1000))
      yield* TestClock.adjust("5 minutes")
      for (const [what, ts] of [["polls", a.times("assignments")], ["start-up checks", verifier.times("heartbeat")]] as const) {
        assert.isAtLeast(ts.length, 6, `${what}: ${JSON.stringify(ts)}`)
        for (const g of gaps(ts)) {
          assert.isAtMost(g, 45_000, `${what} ${g} ms apart after a Retry-After of an hour`)
          assert.isAtLeast(g, 30_000, `${what} ${g} ms apart: the advice is still honoured up to the cap`)
        }
      }
    }).pipe(Effect.provideService(Random.Random, fixedRandom(highest))))

  effect("a failed action's retry pass backs off to the cap while the action keeps failing (each failure an HTTP round trip after its pass's read)", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const a = watched(fake, "a")
      const agent = yield* agentWith(a.client, "a")
      yield* fake.addSession("s1", "a", 256)
      a.failing.set("started", new CoordinatorError({ op: "started", status: 500, message: "boom" }))
      a.slow.set("started", 200)
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      // The start reads the image store (real file I/O) before its simulated 50 ms: step the clock until it asks.
      for (let i = 0; i < 2000 && a.times("started").length === 0; i++) {
        yield* Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, 1)))
        yield* TestClock.adjust("1 millis")
      }
      for (let i = 0; i < 120; i++) yield* TestClock.adjust("1 second")
      const reads = a.times("assignments", (w) => w === 0)
      const g = gaps(reads)
      // The highest draws: 2, 4, 8, 16, then 30 s (the cap) between reads, each plus the 200 ms the failure takes.
      assert.deepStrictEqual(g.slice(0, 5), [4200, 8200, 16200, 30200, 30200], `reads ${JSON.stringify(reads)}`)
      assert.isAtMost(reads.length, 8, `${reads.length} reads in 2 minutes`)
    }).pipe(Effect.provideService(Random.Random, fixedRandom(highest))))

  effect("a failed action's retry pass keeps backing off while other actions succeed between its failures (one success among failures is no healthy period)", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const a = watched(fake, "a")
      yield* fake.addSession("s1", "a", 256)
      // Each fresh read (the retry pass's) finds a new session, whose start and acknowledgement
      // succeed 50 ms in; s1's acknowledgement keeps failing, 200 ms in.
      let added = 0
      const client: CoordinatorShape = {
        ...a.client,
        assignments: (o) => (o.waitMs === 0 ? Effect.andThen(fake.addSession(`n${++added}`, "a", 256), a.client.assignments(o)) : a.client.assignments(o)),
        started: (id) => (id === "s1" ? Effect.andThen(Effect.sleep(200), Effect.fail(new CoordinatorError({ op: "started", status: 500, message: "boom" }))) : a.client.started(id)),
      }
      // Images held in memory (none): no file I/O, every step on the TestClock.
      const images: ImageStore.ImageStore = { root: "", pathFor: (id) => id, prepare: (id) => Effect.succeed(id), get: () => Effect.succeed(undefined), remove: () => Effect.void }
      const agent = yield* agentWith(client, "a", {}, images)
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      for (let i = 0; i < 120; i++) yield* TestClock.adjust("1 second")
      const reads = a.times("assignments", (w) => w === 0)
      const sessions = (yield* fake.get).sessions
      assert.isAtLeast(reads.length, 5, `reads ${JSON.stringify(reads)}`)
      for (let k = 1; k < reads.length; k++) assert.strictEqual(sessions.get(`n${k}`)?.state, "running", `n${k} started`)
      // The highest draws: 4, 8, 16, then 30 s (the cap) between reads, each plus the 200 ms the failure takes, as without the successes.
      assert.deepStrictEqual(gaps(reads).slice(0, 4), [4200, 8200, 16200, 30200], `reads ${JSON.stringify(reads)}`)
    }).pipe(Effect.provideService(Random.Random, fixedRandom(highest))))
})

describe("the retry pass's read backs off from where the pass is", () => {
  effect("a read that fails after rounds of pauses is tried again at the pass's back-off, not from the first delay", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const a = watched(fake, "a")
      yield* fake.addSession("s1", "a", 256)
      // s1's acknowledgement keeps failing (200 ms in): each round's read finds it again and fails it again.
      let readsFail = false
      const client: CoordinatorShape = {
        ...a.client,
        assignments: (o) => (o.waitMs === 0 && readsFail ? Effect.andThen(a.client.assignments(o), Effect.fail(away())) : a.client.assignments(o)),
        started: (id) => (id === "s1" ? Effect.andThen(Effect.sleep(200), Effect.fail(new CoordinatorError({ op: "started", status: 500, message: "boom" }))) : a.client.started(id)),
      }
      const images: ImageStore.ImageStore = { root: "", pathFor: (id) => id, prepare: (id) => Effect.succeed(id), get: () => Effect.succeed(undefined), remove: () => Effect.void }
      const agent = yield* agentWith(client, "a", {}, images)
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      // Four rounds (pauses of 2, 4, 8 and 16 s at the highest draws), then the coordinator fails the reads.
      for (let i = 0; i < 120 && a.times("assignments", (w) => w === 0).length < 4; i++) yield* TestClock.adjust("500 millis")
      readsFail = true
      const from = a.times("assignments", (w) => w === 0).length
      for (let i = 0; i < 200; i++) yield* TestClock.adjust("1 second")
      const failed = a.times("assignments", (w) => w === 0).slice(from)
      assert.isAtLeast(failed.length, 4, `reads ${JSON.stringify(failed)}`)
      // The pass is past its fourth round: its read's retries wait the cap (30 s). Before, each round's read started again at 2 s: [2000, 4000, 8000, …].
      assert.deepStrictEqual(gaps(failed).slice(0, 3), [30000, 30000, 30000], `reads ${JSON.stringify(failed)}`)
    }).pipe(Effect.provideService(Random.Random, fixedRandom(highest))))
})

describe("a heartbeat never comes later than its interval after the last, whatever the coordinator or a proxy asked", () => {
  const intervalMs = defaultAgentConfig("a").heartbeatIntervalMs
  effect("every heartbeat refused with a retryAfterMs of 100 s (over the interval): still one every interval", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const a = watched(fake, "a")
      const agent = yield* agentWith(a.client, "a")
      a.failing.set("heartbeat", away(100_000))
      yield* Effect.forkChild(agent.run)
      yield* TestClock.adjust("5 minutes")
      const ts = a.times("heartbeat")
      assert.isAtLeast(ts.length, 7, JSON.stringify(ts))
      for (const g of gaps(ts)) assert.isAtMost(g, intervalMs, `heartbeats ${g} ms apart: ${JSON.stringify(ts)}`)
    }).pipe(Effect.provideService(Random.Random, fixedRandom(0))))

  effect("one heartbeat answered by a proxy's 503 with Retry-After: 60: the next still within the interval", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const c = fake.client("a")
      const sent: number[] = []
      const client: CoordinatorShape = {
        ...c,
        heartbeat: Effect.flatMap(Clock.currentTimeMillis, (t) => {
          sent.push(t)
          return sent.length === 3 ? Effect.fail(new CoordinatorError({ op: "heartbeat", status: 503, message: "proxy", retryAfterMs: 60_000 })) : c.heartbeat
        }),
      }
      const agent = yield* agentWith(client, "a")
      yield* Effect.forkChild(agent.run)
      yield* TestClock.adjust("6 minutes")
      assert.isAtLeast(sent.length, 9, JSON.stringify(sent))
      for (const g of gaps(sent)) assert.isAtMost(g, intervalMs, `heartbeats ${g} ms apart: ${JSON.stringify(sent)}`)
    }).pipe(Effect.provideService(Random.Random, fixedRandom(highest))))

  effect("heartbeats that hang until their timeout (30 s): measured from one send to the next, still one every interval", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const a = watched(fake, "a")
      const agent = yield* agentWith(a.client, "a")
      a.failing.set("heartbeat", new CoordinatorError({ op: "heartbeat", status: null, message: "timed out" }))
      a.slow.set("heartbeat", 30_000)
      yield* Effect.forkChild(agent.run)
      yield* TestClock.adjust("5 minutes")
      const ts = a.times("heartbeat")
      assert.isAtLeast(ts.length, 7, JSON.stringify(ts))
      for (const g of gaps(ts)) assert.isAtMost(g, intervalMs, `heartbeats sent ${g} ms apart: ${JSON.stringify(ts)}`)
    }).pipe(Effect.provideService(Random.Random, fixedRandom(highest))))
})

describe("agents started at one instant spread out", () => {
  effect("heartbeats and reports of agents started together land at instants of their own, each heartbeat within one interval of the last", () =>
    Effect.gen(function* () {
      const fake = yield* makeFakeCoordinator
      const hosts = ["a", "b", "c", "d", "e"].map((id) => ({ id, w: watched(fake, id) }))
      for (const h of hosts) {
        const agent = yield* agentWith(h.w.client, h.id)
        // Each host draws from its own generator, as separate machines do.
        yield* Effect.forkChild(agent.run.pipe(Random.withSeed(`host-${h.id}`)))
      }
      yield* TestClock.adjust("10 minutes")
      const intervalMs = defaultAgentConfig("a").heartbeatIntervalMs
      for (const op of ["heartbeat", "report"]) {
        const byHost = hosts.map((h) => h.w.times(op))
        // All start at once (the heartbeat and the report on start); after that, no instant is shared.
        assert.deepStrictEqual(byHost.map((ts) => ts[0]), [0, 0, 0, 0, 0])
        const later = byHost.flatMap((ts) => ts.slice(1))
        assert.strictEqual(new Set(later).size, later.length, `${op}s in lock-step: ${JSON.stringify(byHost)}`)
        const seconds = byHost.map((ts) => ts[1]!)
        assert.isAbove(Math.max(...seconds) - Math.min(...seconds), (op === "heartbeat" ? intervalMs : 30_000) / 4, `the second ${op}s: ${JSON.stringify(seconds)}`)
      }
      // The stale window's guarantee is the interval's: no heartbeat comes later than one interval after the last.
      for (const h of hosts) {
        const ts = h.w.times("heartbeat")
        assert.isAtLeast(ts.length, 15)
        for (const g of gaps(ts)) assert.isAtMost(g, intervalMs)
        for (const g of gaps(ts).slice(1)) assert.isAtLeast(g, 0.9 * intervalMs - 1)
      }
    }))
})

describe("polls that would go together are spread", () => {
  effect("the pause after an unchanged answer is drawn in half to one and a half of min(ENGRAM_AGENT_RETRY_MS, 1 s); a poll moved to another replica waits a draw within 1 s", () =>
    Effect.gen(function* () {
      const draw = <A>(r: number, eff: Effect.Effect<A>) => eff.pipe(Effect.provideService(Random.Random, fixedRandom(r)))
      assert.deepStrictEqual([yield* draw(0, Pacing.pollPauseMs(1000)), yield* draw(0.5, Pacing.pollPauseMs(1000)), yield* draw(highest, Pacing.pollPauseMs(1000))], [500, 1000, 1500])
      assert.strictEqual(yield* draw(0.5, Pacing.pollPauseMs(200)), 200)
      assert.deepStrictEqual([yield* draw(0, Pacing.moveSpreadMs()), yield* draw(highest, Pacing.moveSpreadMs())], [0, 1000])
    }),
  )
})
