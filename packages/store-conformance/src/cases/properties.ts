/**
 * Property cases (fast-check): random sequences of store operations, with the store-wide
 * invariants checked after every step (no over-commit, one session-owned reservation per
 * holding session, no reservation without an owner, queued sessions hold nothing, the queue
 * in FIFO order) and "a failed operation changes nothing" checked after every failure.
 */
import type { Limits } from "@engram/core"
import type { OwnerKind } from "@engram/core"
import type { StoreError, StoreShape } from "@engram/store"
import { expect } from "@effect/vitest"
import { Clock, Effect, Result } from "effect"
import { TestClock } from "effect/testing"
import fc from "fast-check"
import { kase, limitsOf, peerUrlOf, prelude, reservationsNow, snapshot, store, violations } from "../Harness.js"
import type { Env, Group } from "../Harness.js"

const hostIds = ["h0", "h1", "h2"] as const
const sessionIds = ["s0", "s1", "s2", "s3", "s4", "s5"] as const
const externalIds = ["x0", "x1", "x2", "x3"] as const
/** Each session id always asks for the same budget, so repeated creates are idempotent. */
const budgets = [
  { memMib: 512, vcpus: 1 },
  { memMib: 1024, vcpus: 1 },
  { memMib: 2048, vcpus: 2 },
  { memMib: 3072, vcpus: 1 },
  { memMib: 1536, vcpus: 4 },
  { memMib: 4096, vcpus: 2 },
] as const

const host = fc.constantFrom(...hostIds)
const session = fc.nat({ max: sessionIds.length - 1 })
const external = fc.constantFrom(...externalIds)

/** One random operation. */
export type Op =
  | { readonly op: "register"; readonly host: string }
  | {
      readonly op: "report"
      readonly host: string
      readonly allocatableMib: number | null
      readonly totalVcpus: number | null
      /** Whether the report advertises a peer URL: the host then takes moves. */
      readonly peer: boolean
    }
  | { readonly op: "setState"; readonly host: string; readonly state: "ready" | "cordoned" | "draining" }
  | { readonly op: "create"; readonly session: number; readonly affinity: string | null }
  | { readonly op: "markRunning" | "unpark" | "beginDescent" | "finishDescent" | "resume" | "end"; readonly session: number }
  | { readonly op: "idle"; readonly session: number }
  /** The session's next natural step from the state it is in now (`choice` picks among branches). */
  | { readonly op: "advance"; readonly session: number; readonly choice: number }
  | { readonly op: "drain"; readonly limit: number | null }
  | {
      readonly op: "reserve"
      readonly id: string
      readonly host: string
      readonly ownerKind: OwnerKind
      readonly memMib: number
      readonly vcpus: number
      readonly expiresInMs: number | null
    }
  | { readonly op: "release"; readonly id: string }
  | { readonly op: "releaseSession"; readonly session: number }
  | { readonly op: "heartbeat"; readonly id: string }
  | { readonly op: "heartbeatHost"; readonly host: string }
  | { readonly op: "tick"; readonly ms: number }
  | { readonly op: "reclaim" }
  | { readonly op: "beginMove"; readonly session: number; readonly target: string | null }
  | { readonly op: "recordRound"; readonly session: number }
  | { readonly op: "commitMove"; readonly session: number }
  | { readonly op: "abortMove"; readonly session: number }

const lifecycle = fc.constantFrom("markRunning", "unpark", "beginDescent", "finishDescent", "resume", "end" as const)

/** The operation generator: weighted towards the life cycle and placement. */
export const opArbitrary: fc.Arbitrary<Op> = fc.oneof(
  { arbitrary: fc.record({ op: fc.constant("register" as const), host }), weight: 2 },
  {
    arbitrary: fc.record({
      op: fc.constant("report" as const),
      host,
      allocatableMib: fc.constantFrom(null, 512, 3072, 5120, 9216),
      totalVcpus: fc.constantFrom(null, 1, 2, 4),
      peer: fc.boolean(),
    }),
    weight: 3,
  },
  { arbitrary: fc.record({ op: fc.constant("setState" as const), host, state: fc.constantFrom("ready", "cordoned", "draining" as const) }), weight: 1 },
  { arbitrary: fc.record({ op: fc.constant("create" as const), session, affinity: fc.option(host, { nil: null }) }), weight: 6 },
  { arbitrary: fc.record({ op: lifecycle, session }), weight: 10 },
  { arbitrary: fc.record({ op: fc.constant("idle" as const), session }), weight: 2 },
  { arbitrary: fc.record({ op: fc.constant("advance" as const), session, choice: fc.nat({ max: 5 }) }), weight: 16 },
  { arbitrary: fc.record({ op: fc.constant("drain" as const), limit: fc.option(fc.integer({ min: 1, max: 3 }), { nil: null }) }), weight: 3 },
  {
    arbitrary: fc.record({
      op: fc.constant("reserve" as const),
      id: external,
      host,
      ownerKind: fc.constantFrom("external", "capture" as const),
      memMib: fc.integer({ min: 1, max: 4096 }),
      vcpus: fc.integer({ min: 0, max: 4 }),
      expiresInMs: fc.option(fc.integer({ min: 0, max: 200_000 }), { nil: null }),
    }),
    weight: 3,
  },
  { arbitrary: fc.record({ op: fc.constant("release" as const), id: external }), weight: 2 },
  { arbitrary: fc.record({ op: fc.constant("releaseSession" as const), session }), weight: 1 },
  { arbitrary: fc.record({ op: fc.constant("heartbeat" as const), id: external }), weight: 1 },
  { arbitrary: fc.record({ op: fc.constant("heartbeatHost" as const), host }), weight: 2 },
  { arbitrary: fc.record({ op: fc.constant("tick" as const), ms: fc.integer({ min: 0, max: 150_000 }) }), weight: 2 },
  { arbitrary: fc.record({ op: fc.constant("reclaim" as const) }), weight: 2 },
  { arbitrary: fc.record({ op: fc.constant("beginMove" as const), session, target: fc.option(host, { nil: null }) }), weight: 3 },
  { arbitrary: fc.record({ op: fc.constant("recordRound" as const), session }), weight: 1 },
  { arbitrary: fc.record({ op: fc.constant("commitMove" as const), session }), weight: 2 },
  { arbitrary: fc.record({ op: fc.constant("abortMove" as const), session }), weight: 1 },
)

/** The limits a run decides with: the defaults and a few tighter or looser policies. */
const limitsArbitrary: fc.Arbitrary<Limits.Limits> = fc.constantFrom(
  limitsOf({ maxEntriesPerNode: 4 }),
  limitsOf({ maxEntriesPerNode: 6, memOvercommitRatio: 1.5, cpuOvercommit: 1 }),
  limitsOf({ requireMeasured: true, systemReserveMib: 512 }),
  limitsOf({ memOvercommitRatio: 0, maxEntriesPerNode: 5 }),
)

const sid = (i: number): string => sessionIds[i] as string

/** The source's last two calls: the final round (already recorded is fine), then the commit. */
const finalThenCommit = (s: StoreShape, moveId: string): Effect.Effect<unknown, StoreError> =>
  s.recordRound(moveId, { kind: "final", wireBytes: 1000, apparentBytes: 2000, sendMs: 5, captureMs: 1 }).pipe(
    Effect.catchTag("Conflict", () => Effect.void),
    Effect.andThen(s.commitMove(moveId, { downtimeMs: 500, captureMs: 40, sendMs: 60, commitMs: 380 })),
  )

const withOpenMove = (s: StoreShape, i: number, f: (moveId: string) => Effect.Effect<unknown, StoreError>) =>
  Effect.flatMap(s.openMove(sid(i)), (m) => (m === null ? Effect.void : f(m.id)))

/** Runs one operation through the interface. */
export const apply = (s: StoreShape, o: Op): Effect.Effect<unknown, StoreError, never> => {
  switch (o.op) {
    case "register":
      return s.registerHost({ id: o.host })
    case "report":
      return s.reportHost(o.host, {
        totalMib: o.allocatableMib,
        allocatableMib: o.allocatableMib,
        totalVcpus: o.totalVcpus,
        ...(o.peer ? { peerUrl: peerUrlOf(o.host) } : {}),
      })
    case "setState":
      return s.setHostState(o.host, o.state)
    case "create":
      return s.createSession({
        id: sid(o.session),
        budget: budgets[o.session] as (typeof budgets)[number],
        ...(o.affinity === null ? {} : { affinity: [o.affinity] }),
      })
    case "markRunning":
      return s.markRunning(sid(o.session))
    case "unpark":
      return s.unpark(sid(o.session))
    case "beginDescent":
      return s.beginDescent(sid(o.session))
    case "finishDescent":
      return s.finishDescent(sid(o.session))
    case "resume":
      return s.resume(sid(o.session))
    case "end":
      return s.endSession(sid(o.session))
    case "idle":
      return s.idle(sid(o.session))
    case "advance":
      return Effect.flatMap(Effect.result(s.getSession(sid(o.session))), (found): Effect.Effect<unknown, StoreError> => {
        // A session not created yet: its next step is its create.
        if (Result.isFailure(found)) return apply(s, { op: "create", session: o.session, affinity: null })
        const x = found.success
        const id = x.id
        switch (x.state) {
          case "pending":
            return o.choice === 0 ? s.endSession(id) : s.markRunning(id)
          case "running":
            return o.choice <= 2
              ? s.idle(id)
              : o.choice === 3
                  ? s.beginMove({ sessionId: id, maxDowntimeMs: 600 })
                  : o.choice === 4
                    ? s.endSession(id)
                    : s.beginMove({ sessionId: id, targetHostId: "h1", maxDowntimeMs: 600 })
          case "parked":
            return o.choice <= 2 ? s.unpark(id) : o.choice === 5 ? s.endSession(id) : s.beginDescent(id)
          case "descending":
            return s.finishDescent(id)
          case "descended":
            return o.choice === 0 ? s.endSession(id) : s.resume(id)
          case "moving":
            return Effect.flatMap(s.openMove(id), (m): Effect.Effect<unknown, StoreError> =>
              m === null
                ? Effect.void
                : o.choice <= 2
                  ? finalThenCommit(s, m.id)
                  : s.abortMove(m.id, "property abort"),
            )
          case "queued":
            return o.choice <= 3 ? s.drainQueue() : s.endSession(id)
          case "lost":
            return s.endSession(id)
          case "ended":
            return s.createSession({ id, budget: x.budget })
        }
      })
    case "drain":
      return s.drainQueue(o.limit === null ? {} : { limit: o.limit })
    case "reserve":
      return Effect.flatMap(Clock.currentTimeMillis, (now) =>
        s.reserve({
          id: o.id,
          hostId: o.host,
          ownerKind: o.ownerKind,
          ownerId: "prop",
          memMib: o.memMib,
          vcpus: o.vcpus,
          expiresAt: o.expiresInMs === null ? null : now + o.expiresInMs,
        }),
      )
    case "release":
      return s.release(o.id)
    case "releaseSession":
      return Effect.flatMap(
        s.getSession(sid(o.session)),
        (x): Effect.Effect<unknown, StoreError> => (x.reservationId === null ? Effect.void : s.release(x.reservationId)),
      )
    case "heartbeat":
      return s.heartbeat(o.id)
    case "heartbeatHost":
      return s.heartbeatHost(o.host)
    case "tick":
      return TestClock.adjust(o.ms)
    case "reclaim":
      return s.reclaim()
    case "beginMove":
      return s.beginMove({ sessionId: sid(o.session), maxDowntimeMs: 600, ...(o.target === null ? {} : { targetHostId: o.target }) })
    case "recordRound":
      return withOpenMove(s, o.session, (id) => s.recordRound(id, { kind: "delta", wireBytes: 1000, apparentBytes: 2000, sendMs: 5, captureMs: 1 }))
    case "commitMove":
      return withOpenMove(s, o.session, (id) => finalThenCommit(s, id))
    case "abortMove":
      return withOpenMove(s, o.session, (id) => s.abortMove(id, "property abort"))
  }
}

/** Runs a sequence from an empty store, checking every invariant after every step. */
const runSequence = (limits: Limits.Limits, ops: readonly Op[]): Effect.Effect<void, unknown, Env> =>
  Effect.gen(function* () {
    yield* prelude(limits)
    const s = yield* store
    // Two measured hosts from the start, so short sequences reach the deeper session states;
    // h2 and every later report come from the generator.
    for (const [id, allocatableMib, totalVcpus] of [
      ["h0", 9216, 4],
      ["h1", 5120, 2],
    ] as const) {
      yield* s.registerHost({ id })
      yield* s.reportHost(id, { totalMib: allocatableMib, allocatableMib, totalVcpus, peerUrl: peerUrlOf(id) })
    }
    let previous = (yield* violations()).reservedByHost
    for (const [i, o] of ops.entries()) {
      const before = yield* snapshot
      const result = yield* Effect.result(apply(s, o))
      if (Result.isFailure(result)) {
        if (result.failure._tag === "Unavailable") return yield* Effect.fail(result.failure)
        const after = yield* snapshot
        expect(after, `step ${i} ${JSON.stringify(o)} failed with ${result.failure._tag} yet changed the store`).toStrictEqual(before)
      }
      const checked = yield* violations(previous)
      expect(checked.violations, `after step ${i} ${JSON.stringify(o)}`).toStrictEqual([])
      previous = checked.reservedByHost
    }
  })

/** The options of the property cases. */
export interface PropertyOptions {
  readonly numRuns: number
  readonly stepsPerRun: number
  readonly seed?: number
}

export const properties = (options: PropertyOptions): Group => ({
  name: "properties",
  cases: [
    kase(
      "random operation sequences keep every ledger and session invariant after every step",
      Effect.gen(function* () {
        const context = yield* Effect.context<Env>()
        yield* Effect.promise(() =>
          fc.assert(
            fc.asyncProperty(limitsArbitrary, fc.array(opArbitrary, { minLength: Math.ceil(options.stepsPerRun / 2), maxLength: options.stepsPerRun }), (limits, ops) =>
              Effect.runPromise(Effect.provide(runSequence(limits, ops), context)),
            ),
            { numRuns: options.numRuns, ...(options.seed === undefined ? {} : { seed: options.seed }) },
          ),
        )
      }),
    ),
    kase(
      "random create, end and drain bursts never over-commit a host",
      Effect.gen(function* () {
        const context = yield* Effect.context<Env>()
        const burst = fc.array(
          fc.oneof(
            fc.record({ op: fc.constant("create" as const), session, affinity: fc.option(host, { nil: null }) }),
            fc.record({ op: fc.constant("end" as const), session }),
            fc.record({ op: fc.constant("drain" as const), limit: fc.constant(null) }),
          ),
          { minLength: 1, maxLength: 16 },
        )
        yield* Effect.promise(() =>
          fc.assert(
            fc.asyncProperty(fc.array(burst, { minLength: 1, maxLength: 4 }), (bursts) =>
              Effect.runPromise(
                Effect.provide(
                  Effect.gen(function* () {
                    yield* prelude(limitsOf({ maxEntriesPerNode: 5 }))
                    const s = yield* store
                    yield* s.registerHost({ id: "h0" })
                    yield* s.reportHost("h0", { totalMib: null, allocatableMib: 5120, totalVcpus: 2 })
                    yield* s.registerHost({ id: "h1" })
                    yield* s.reportHost("h1", { totalMib: null, allocatableMib: 9216, totalVcpus: 1 })
                    for (const b of bursts) {
                      yield* Effect.all(
                        b.map((o) => Effect.result(apply(s, o))),
                        { concurrency: "unbounded" },
                      )
                      const checked = yield* violations()
                      expect(checked.violations, `after burst ${JSON.stringify(b)}`).toStrictEqual([])
                    }
                  }),
                  context,
                ),
              ),
            ),
            { numRuns: options.numRuns, ...(options.seed === undefined ? {} : { seed: options.seed }) },
          ),
        )
      }),
    ),
    kase(
      "concurrent creates on a nearly full fleet never over-commit, and each answers as its session stands",
      Effect.gen(function* () {
        const context = yield* Effect.context<Env>()
        // Up to 40 creates at once over a pool of 24 ids (a repeated id asks for the same budget
        // and affinity, so it is an idempotent create); 1–3 small hosts that fill up within a burst.
        const ids = Array.from({ length: 24 }, (_, i) => `n${String(i).padStart(2, "0")}`)
        const budgetOf = (i: number) => ({ memMib: 512 * (1 + (i % 5)), vcpus: 1 + (i % 3) })
        const fleet = fc.array(fc.record({ allocatableMib: fc.constantFrom(2048, 4096, 6144), totalVcpus: fc.constantFrom(1, 2, 4) }), {
          minLength: 1,
          maxLength: 3,
        })
        // Each id's preferred host, or none: a repeat with another affinity would be a Conflict (another session).
        const affinities = fc.array(fc.option(host, { nil: null }), { minLength: ids.length, maxLength: ids.length })
        const burst = fc.array(fc.record({ session: fc.nat({ max: ids.length - 1 }) }), {
          minLength: 2,
          maxLength: 40,
        })
        yield* Effect.promise(() =>
          fc.assert(
            fc.asyncProperty(fleet, affinities, fc.array(burst, { minLength: 1, maxLength: 2 }), (hosts, affinityOf, bursts) =>
              Effect.runPromise(
                Effect.provide(
                  Effect.gen(function* () {
                    yield* prelude(limitsOf({ maxEntriesPerNode: 4 }))
                    const s = yield* store
                    for (const [i, h] of hosts.entries()) {
                      yield* s.registerHost({ id: `h${i}` })
                      yield* s.reportHost(`h${i}`, { totalMib: null, ...h })
                    }
                    for (const b of bursts) {
                      const results = yield* Effect.all(
                        b.map((c) => {
                          const affinity = affinityOf[c.session] ?? null
                          return Effect.result(
                            s.createSession({
                              id: ids[c.session] as string,
                              budget: budgetOf(c.session),
                              ...(affinity === null ? {} : { affinity: [affinity] }),
                            }),
                          )
                        }),
                        { concurrency: "unbounded" },
                      )
                      const checked = yield* violations()
                      expect(checked.violations, `after burst ${JSON.stringify(b)}`).toStrictEqual([])
                      const sessions = new Map((yield* s.listSessions()).map((x) => [x.id, x]))
                      for (const [k, r] of results.entries()) {
                        const id = ids[(b[k] as { session: number }).session] as string
                        expect(Result.isSuccess(r), `create ${id} answers`).toBe(true)
                        if (Result.isFailure(r)) continue
                        const now = sessions.get(id)
                        // Nothing else changes these sessions: a create answers the state it left.
                        expect(now?.state, id).toBe(r.success._tag === "Placed" ? "pending" : "queued")
                        if (r.success._tag === "Placed") expect(now?.hostId, id).toBe(r.success.session.hostId)
                      }
                      // Every placed session holds exactly one reservation of its budget.
                      const entries = yield* reservationsNow(s)
                      for (const x of sessions.values())
                        expect(entries.filter((e) => e.ownerId === x.id).length, x.id).toBe(x.state === "pending" ? 1 : 0)
                    }
                  }),
                  context,
                ),
              ),
            ),
            { numRuns: options.numRuns, ...(options.seed === undefined ? {} : { seed: options.seed }) },
          ),
        )
      }),
    ),
  ],
})
