// The guard's commit allowance as the coordinator hands it out (SPEC §13), on the in-memory store
// under a TestClock: commits older than the horizon stop counting, so a pair refused before any
// pause relearns; a pair without commits of its own learns from its target's, then the fleet's.
import { assert, describe, it } from "@effect/vitest"
import { Records } from "@engram/api"
import { Changes, Store } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Effect, Layer, Schema } from "effect"
import { TestClock } from "effect/testing"
import * as Allowances from "../src/Allowances.js"
import { Assignments } from "../src/Assignments.js"
import * as Config from "../src/Config.js"
import { Notifier } from "../src/Notifier.js"
import { Settings } from "../src/Settings.js"

const settings = { priorMs: 400, horizonMs: 60_000 }
const finalRound = { kind: "final", wireBytes: 1000, apparentBytes: 2000, sendMs: 10, captureMs: 5 } as const

/** Moves session `s1` from its host to `to` and commits with a commit phase of `commitMs`. */
const moveOnce = (to: string, commitMs: number) =>
  Effect.gen(function* () {
    const store = yield* Store
    const move = yield* store.beginMove({ sessionId: "s1", targetHostId: to, maxDowntimeMs: 5000 })
    yield* store.recordRound(move.id, finalRound)
    yield* store.commitMove(move.id, { downtimeMs: commitMs + 100, captureMs: 40, sendMs: 50, commitMs })
  })

/** Measured hosts a, b and c; `s1` running on a. */
const fleet = Effect.gen(function* () {
  const store = yield* Store
  for (const id of ["a", "b", "c"]) {
    yield* store.registerHost({ id })
    yield* store.reportHost(id, { totalMib: 16_384, allocatableMib: 8192, totalVcpus: 8 })
  }
  yield* store.createSession({ id: "s1", budget: { memMib: 1024, vcpus: 1 }, affinity: ["a"] })
  assert.strictEqual((yield* store.markRunning("s1")).hostId, "a")
})

describe("the commit allowance the coordinator hands out", () => {
  it.effect("a pair's slow commits stop counting after the horizon: the prior again, without any new commit of its own", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* fleet
      yield* TestClock.adjust(1000)
      yield* moveOnce("b", 900)
      yield* moveOnce("a", 30)
      yield* moveOnce("b", 950)
      const [spike] = yield* Allowances.forTargets(store, settings, "a", ["b"])
      assert.deepStrictEqual(spike, { sourceHostId: "a", targetHostId: "b", allowanceMs: 950, source: "learned", samples: 2 })
      yield* TestClock.adjust(settings.horizonMs - 1)
      assert.strictEqual((yield* Allowances.forTargets(store, settings, "a", ["b"]))[0]?.allowanceMs, 950)
      yield* TestClock.adjust(1)
      assert.deepStrictEqual(yield* Allowances.forTargets(store, settings, "a", ["b"]), [{ sourceHostId: "a", targetHostId: "b", allowanceMs: 400, source: "prior", samples: 0 }])
      // The kept history still shows the commits, with the allowance they no longer make.
      const [shown] = yield* Allowances.histories(store, settings, "a")
      assert.deepStrictEqual([shown?.commitsMs, shown?.recordedAtMs, shown?.source], [[900, 950], [1000, 1000], "prior"])
    }).pipe(Effect.provide(StoreSim.layer())))

  it.effect("a pair without commits of its own learns from recent commits into its target, then from the fleet's, once a pool holds 5", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* fleet
      for (let i = 0; i < 5; i++) {
        yield* moveOnce("b", 80) // a → b
        yield* moveOnce("a", 700) // b → a
        // One commit into each target is too few to pool: the prior.
        if (i === 0) assert.deepStrictEqual(yield* Allowances.forTargets(store, settings, "c", ["b"]), [{ sourceHostId: "c", targetHostId: "b", allowanceMs: 400, source: "prior", samples: 0 }])
      }
      const answer = yield* Allowances.forTargets(store, settings, "c", ["b", "a", "nowhere", "b"])
      assert.deepStrictEqual(
        answer.map((x) => [x.targetHostId, x.allowanceMs, x.source, x.samples]),
        [["b", 80, "target", 5], ["a", 700, "target", 5], ["nowhere", 700, "fleet", 10]],
      )
      const [asked] = yield* Allowances.histories(store, settings, "c", "b")
      assert.deepStrictEqual(asked, { sourceHostId: "c", targetHostId: "b", allowanceMs: 80, source: "target", samples: 5, commitsMs: [], recordedAtMs: [], updatedAt: null })
      assert.deepStrictEqual(yield* Allowances.histories(store, settings, "c"), [])
      // No pending move from a host: no read at all.
      assert.deepStrictEqual(yield* Allowances.forTargets(store, settings, "c", []), [])
    }).pipe(Effect.provide(StoreSim.layer())))
})

/** The coordinator's services over one store; each `replica` read builds its own Assignments (its own copy in memory), as another replica would. */
const services = Layer.mergeAll(Notifier.layer, Layer.succeed(Settings, Settings.of({ config: Config.defaults(), backend: "custom" }))).pipe(
  Layer.provideMerge(StoreSim.layer()),
  Layer.provideMerge(Changes.local),
)
const replica = (hostId: string) =>
  Effect.gen(function* () {
    return yield* (yield* Assignments).read(hostId)
  }).pipe(Effect.provide(Layer.fresh(Assignments.layer)))

/**
 * The assignments' allowance entry as an agent of the previous release decodes it (frozen
 * here: `source` within "prior" | "learned", no `pool`). A value outside it fails the agent's
 * whole poll ("bad answer"), so it reconciles nothing while it is the source of the move.
 */
const PreviousAssignments = Schema.Struct({
  ...Records.Assignments.fields,
  allowances: Schema.optionalKey(
    Schema.Array(
      Schema.Struct({
        sourceHostId: Schema.String,
        targetHostId: Schema.String,
        allowanceMs: Schema.Number,
        source: Schema.Literals(["prior", "learned"]),
        samples: Schema.Number,
      }),
    ),
  ),
})

describe("the allowances in a host's assignments", () => {
  it.effect("the limits carry the coordinator's stale window; an agent of the previous release (limits of commitAllowanceMs alone) still decodes them", () =>
    Effect.gen(function* () {
      yield* fleet
      const answer = yield* replica("a")
      assert.deepStrictEqual(answer.limits, { commitAllowanceMs: 400, heartbeatStaleWindowMs: Config.defaults().limits.heartbeatStaleWindowMs })
      const wire = JSON.parse(JSON.stringify(Schema.encodeSync(Records.Assignments)(answer))) as unknown
      const old = Schema.decodeUnknownSync(Schema.Struct({ ...Records.Assignments.fields, limits: Schema.optionalKey(Schema.Struct({ commitAllowanceMs: Schema.Number })) }))(wire)
      assert.deepStrictEqual(old.limits, { commitAllowanceMs: 400 })
      // And a coordinator of the previous release, which sends no window, decodes here.
      const older = Schema.decodeUnknownSync(Records.Assignments)({ ...(wire as object), limits: { commitAllowanceMs: 400 } })
      assert.deepStrictEqual(older.limits, { commitAllowanceMs: 400 })
    }).pipe(Effect.provide(services)))

  it.effect("a pooled allowance reaches an agent of the previous release as `learned`, and the new one as its pool", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* fleet
      for (let i = 0; i < 5; i++) {
        yield* moveOnce("b", 80) // a → b
        yield* moveOnce("a", 80) // b → a
      }
      yield* store.createSession({ id: "s2", budget: { memMib: 1024, vcpus: 1 }, affinity: ["c"] })
      assert.strictEqual((yield* store.markRunning("s2")).hostId, "c")
      yield* store.beginMove({ sessionId: "s2", targetHostId: "b", maxDowntimeMs: 5000 })
      const answer = yield* replica("c")
      const wire = JSON.parse(JSON.stringify(Schema.encodeSync(Records.Assignments)(answer))) as unknown
      const old = Schema.decodeUnknownSync(PreviousAssignments)(wire)
      assert.deepStrictEqual(old.allowances, [{ sourceHostId: "c", targetHostId: "b", allowanceMs: 80, source: "learned", samples: 5 }])
      const now = Schema.decodeUnknownSync(Records.Assignments)(wire)
      assert.deepStrictEqual(now.allowances?.map(Records.pairAllowanceOf), [{ sourceHostId: "c", targetHostId: "b", allowanceMs: 80, source: "target", samples: 5 }])
    }).pipe(Effect.provide(services)))

  it.effect("the version does not follow the allowance: two replicas reading different allowances for the same moves answer the same version", () =>
    Effect.gen(function* () {
      const store = yield* Store
      yield* fleet
      yield* TestClock.adjust(1000)
      yield* moveOnce("b", 900) // a → b
      yield* moveOnce("a", 30) // b → a
      yield* store.beginMove({ sessionId: "s1", targetHostId: "b", maxDowntimeMs: 5000 })
      const first = yield* replica("a")
      // The horizon passes: no write, no notice; a replica reading now learns another allowance.
      yield* TestClock.adjust(Config.defaults().allowanceHorizonMs)
      const second = yield* replica("a")
      assert.deepStrictEqual([first.allowances?.[0]?.allowanceMs, second.allowances?.[0]?.allowanceMs], [900, 400])
      assert.strictEqual(second.version, first.version)
    }).pipe(Effect.provide(services)))
})
