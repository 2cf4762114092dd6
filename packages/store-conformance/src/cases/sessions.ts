/**
 * Sessions (SPEC §2): every legal transition, every illegal one refused with nothing changed,
 * idempotent create, and validation errors that name the field and the rule.
 */
import { Session } from "@engram/core"
import type { SessionState } from "@engram/core"
import { liveStates, Validate } from "@engram/store"
import type { StoreError, StoreShape } from "@engram/store"
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { addHost, expectFailure, expectInvariants, expectUnchanged, kase, placed, queued, queueNow, reportFor, reservationsNow, sessionIn, snapshot, store } from "../Harness.js"
import type { Case, Group } from "../Harness.js"

const budget = { memMib: 1024, vcpus: 1 }

/** A state-changing operation and the state it asks for from a session in `from`. */
interface Op {
  readonly name: string
  readonly to: (from: SessionState) => SessionState | null
  readonly from: readonly SessionState[]
  readonly run: (s: StoreShape, id: string) => Effect.Effect<unknown, StoreError>
}

const ops: readonly Op[] = [
  { name: "markRunning", to: () => "running", from: ["pending"], run: (s, id) => s.markRunning(id) },
  // Idle asks to park where the default policy would park it (a measured host, nothing waiting
  // without room: the case's queue holds only a too-big session), else to descend.
  { name: "idle", to: (st) => (Session.holdsReservation(st) ? "parked" : "descending"), from: ["running"], run: (s, id) => s.idle(id) },
  { name: "unpark", to: () => "running", from: ["parked"], run: (s, id) => s.unpark(id) },
  { name: "beginDescent", to: () => "descending", from: ["parked"], run: (s, id) => s.beginDescent(id) },
  { name: "finishDescent", to: () => "descended", from: ["descending"], run: (s, id) => s.finishDescent(id) },
  // resume asks for running (a park, warm), or pending or queued (descended, cold): only `from` is pinned.
  { name: "resume", to: () => null, from: ["parked", "descended"], run: (s, id) => s.resume(id) },
]

const illegalCase = (op: Op): Case =>
  kase(
    `${op.name} refuses every state but ${op.from.join(", ")} and changes nothing`,
    Effect.gen(function* () {
      const s = yield* store
      yield* addHost("h1", 65536)
      yield* addHost("h2", 65536)
      const illegal = Session.states.filter((st) => !op.from.includes(st))
      for (const st of illegal) yield* sessionIn(`s-${st}`, st)
      yield* expectInvariants
      for (const st of illegal) {
        const before = yield* snapshot
        const err = yield* expectFailure(op.run(s, `s-${st}`), "IllegalTransition")
        expect(err).toMatchObject({ sessionId: `s-${st}`, from: st })
        const to = op.to(st)
        if (to !== null) expect(err.to).toBe(to)
        expect(err.reason.length).toBeGreaterThan(0)
        yield* expectUnchanged(before, `${op.name} on a ${st} session`)
      }
    }),
  )

const endCase = (st: SessionState): Case =>
  kase(
    `ending a ${st} session ends it and releases what it holds`,
    Effect.gen(function* () {
      const s = yield* store
      yield* addHost("h1", 65536)
      yield* addHost("h2", 65536)
      yield* sessionIn("x", st)
      const was = yield* s.getSession("x")
      const open = yield* s.openMove("x")
      yield* TestClock.adjust(7)
      const ended = yield* s.endSession("x")
      expect(ended.session).toMatchObject({ id: "x", state: "ended", reservationId: null })
      // What the end changed, from its own change: the session as it found it, and the move it closed.
      expect(ended.before).toStrictEqual(was)
      expect(ended.closedMove).toStrictEqual(open === null ? null : yield* s.getMove(open.id))
      expect((yield* reservationsNow(s)).filter((r) => r.ownerId === "x" || r.ownerKind === "move")).toStrictEqual([])
      expect(yield* s.openMove("x")).toBeNull()
      expect(yield* queueNow(s)).toStrictEqual([])
      yield* expectInvariants
    }),
  )

export const sessions: Group = {
  name: "sessions",
  cases: [
    kase(
      "markRunning moves a pending session to running on the same host",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const x = yield* placed("s1", budget)
        yield* TestClock.adjust(5)
        const running = yield* s.markRunning("s1")
        expect(running).toMatchObject({ state: "running", hostId: "h1", reservationId: x.reservationId, updatedAt: 5, createdAt: 0 })
      }),
    ),
    kase(
      "idle parks a running session on a measured host while no queued session is without room, stamps parkedAt and keeps its reservation",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const x = yield* sessionIn("s1", "running")
        // A queued session too big for every host waits for no descent: it does not stop a park (SPEC §12).
        yield* queued("huge", { memMib: 1 << 20, vcpus: 1 })
        yield* TestClock.adjust(42)
        const parked = yield* s.idle("s1")
        expect(parked).toMatchObject({ state: "parked", parkedAt: 42, hostId: "h1", reservationId: x.reservationId })
        expect((yield* s.getHost("h1")).headroom.reserved.memMib).toBe(1024)
      }),
    ),
    kase(
      "idle starts a descent straight away while a queued session has no room",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 2048)
        const x = yield* sessionIn("s1", "running", { memMib: 2048, vcpus: 1 })
        yield* queued("w", budget)
        const d = yield* s.idle("s1")
        expect(d).toMatchObject({ state: "descending", hostId: "h1", reservationId: x.reservationId, parkedAt: null })
      }),
    ),
    kase(
      "idle starts a descent on an unmeasured host",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("u")
        yield* sessionIn("s1", "running")
        expect((yield* s.idle("s1")).state).toBe("descending")
      }),
    ),
    kase(
      "idle judges the queue against the room now: a queued session that fits since a release does not stop a park",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 4096)
        yield* sessionIn("s1", "running", { memMib: 3072, vcpus: 1 })
        yield* sessionIn("s2", "running")
        yield* queued("w", budget)
        yield* s.endSession("s2")
        // w fits on h1 now (no drain ran yet): it waits for a drain, not for room.
        expect((yield* s.idle("s1")).state).toBe("parked")
      }),
    ),
    kase(
      "unpark returns a parked session to running and clears parkedAt",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* sessionIn("s1", "parked")
        expect(yield* s.unpark("s1")).toMatchObject({ state: "running", parkedAt: null, hostId: "h1" })
      }),
    ),
    kase(
      "beginDescent moves a parked session to descending and keeps its reservation",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const x = yield* sessionIn("s1", "parked")
        expect(yield* s.beginDescent("s1")).toMatchObject({ state: "descending", hostId: "h1", reservationId: x.reservationId })
        expect((yield* s.getHost("h1")).descentsRunning).toBe(1)
      }),
    ),
    kase(
      "finishDescent releases the reservation and clears host and reservation",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const x = yield* sessionIn("s1", "descending")
        const done = yield* s.finishDescent("s1")
        expect(done).toMatchObject({ state: "descended", hostId: null, reservationId: null })
        yield* expectFailure(s.getReservation(x.reservationId as string), "NotFound")
        expect((yield* s.getHost("h1")).headroom.reserved).toStrictEqual({ memMib: 0, vcpus: 0 })
      }),
    ),
    kase(
      "resume places a descended session with a new reservation",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* sessionIn("s1", "descended")
        const outcome = yield* s.resume("s1")
        expect(outcome._tag).toBe("Placed")
        expect(outcome.session).toMatchObject({ state: "pending", hostId: "h1" })
        const r = yield* s.getReservation(outcome.session.reservationId as string)
        expect(r).toMatchObject({ ownerKind: "session", ownerId: "s1", memMib: 1024 })
        expect((yield* s.markRunning("s1")).state).toBe("running")
      }),
    ),
    kase(
      "resume of a parked session is warm: running again on the same host with the same reservation, no placement, no queue",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* addHost("h2", 65536)
        const x = yield* sessionIn("s1", "parked")
        expect(x.hostId).toBe("h1")
        const metrics = yield* s.metrics()
        yield* TestClock.adjust(9)
        const outcome = yield* s.resume("s1")
        expect(outcome).toStrictEqual({
          _tag: "Placed",
          session: { ...x, state: "running", parkedAt: null, lastActiveAt: 9, updatedAt: 9 },
        })
        expect(yield* s.metrics()).toStrictEqual(metrics)
        expect((yield* reservationsNow(s)).map((r) => r.id)).toStrictEqual([x.reservationId])
        expect((yield* s.getHost("h1")).parks).toBe(0)
        yield* expectInvariants
      }),
    ),
    kase(
      "a warm resume needs no room: a park on a host reserved beyond its capacity resumes where it is",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 4096)
        yield* sessionIn("s1", "parked", { memMib: 4096, vcpus: 1 })
        // The host shrinks under its park: nothing else could be placed there now.
        yield* s.reportHost("h1", reportFor(1024, 8, s.limits()))
        expect((yield* s.resume("s1")).session).toMatchObject({ state: "running", hostId: "h1" })
      }),
    ),
    kase(
      "a create with onNoRoom refuse that fits nowhere is NoRoom with the no-fit details, and nothing is stored",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 2048)
        yield* placed("s0", { memMib: 1536, vcpus: 1 })
        const before = yield* snapshot
        const err = yield* expectFailure(s.createSession({ id: "s1", budget: { memMib: 1024, vcpus: 1 }, onNoRoom: "refuse" }), "NoRoom")
        expect(err).toMatchObject({ sessionId: "s1", tooBig: false, noFit: [{ hostId: "h1", reason: "ram_full", freeMib: 512 }] })
        const huge = yield* expectFailure(s.createSession({ id: "s2", budget: { memMib: 4096, vcpus: 1 }, onNoRoom: "refuse" }), "NoRoom")
        expect(huge.tooBig).toBe(true)
        yield* expectUnchanged(before, "refused creates")
        yield* expectFailure(s.getSession("s1"), "NotFound")
        expect((yield* s.metrics()).reserveFailures).toBe(0)
        // One that fits is placed as usual, and "queue" keeps the default.
        expect((yield* s.createSession({ id: "s3", budget: { memMib: 256, vcpus: 1 }, onNoRoom: "refuse" }))._tag).toBe("Placed")
        expect((yield* s.createSession({ id: "s4", budget: { memMib: 1024, vcpus: 1 }, onNoRoom: "queue" }))._tag).toBe("Queued")
      }),
    ),
    kase(
      "an affinity entry that is no host id (the id rule: a NUL, a lone surrogate, empty, a slash, an emoji) is refused naming it, and nothing is stored",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const before = yield* snapshot
        expect((yield* expectFailure(s.createSession({ id: "s1", budget, affinity: ["h1", "x\u0000"] }), "InvalidInput")).field).toBe("affinity.1")
        expect((yield* expectFailure(s.createSession({ id: "s1", budget, affinity: ["\ud83d"] }), "InvalidInput")).field).toBe("affinity.0")
        for (const [entry, field] of [["", "affinity.0"], ["a/b", "affinity.0"], ["😀", "affinity.0"], ["..", "affinity.0"]] as const) {
          expect(yield* expectFailure(s.createSession({ id: "s1", budget, affinity: [entry, "h1"] }), "InvalidInput")).toMatchObject({ field, rule: Validate.idRule })
        }
        yield* expectUnchanged(before, "creates with bad affinity entries")
        expect((yield* placed("s1", budget, ["h-2.b_3", "h1"])).affinity).toStrictEqual(["h-2.b_3", "h1"])
      }),
    ),
    kase(
      "a full life cycle walks queued, pending, running, parked, descending, descended, pending, running, ended",
      Effect.gen(function* () {
        const s = yield* store
        const q = yield* queued("s1", budget)
        expect(q.session.state).toBe("queued")
        yield* addHost("h1", 4096)
        yield* s.drainQueue()
        const seen: string[] = [q.session.state, (yield* s.getSession("s1")).state]
        seen.push((yield* s.markRunning("s1")).state)
        seen.push((yield* s.idle("s1")).state)
        seen.push((yield* s.beginDescent("s1")).state)
        seen.push((yield* s.finishDescent("s1")).state)
        seen.push((yield* s.resume("s1")).session.state)
        seen.push((yield* s.markRunning("s1")).state)
        seen.push((yield* s.endSession("s1")).session.state)
        expect(seen).toStrictEqual(["queued", "pending", "running", "parked", "descending", "descended", "pending", "running", "ended"])
        yield* expectInvariants
      }),
    ),
    ...ops.map(illegalCase),
    kase(
      "ending an ended session answers it as it is and changes nothing (ending is idempotent)",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* sessionIn("s1", "ended")
        const before = yield* snapshot
        const events = (yield* s.sessionEvents("s1", { limit: 100 })).items.length
        const again = yield* s.endSession("s1")
        expect(again.session).toStrictEqual(yield* s.getSession("s1"))
        expect(again.session).toMatchObject({ id: "s1", state: "ended", hostId: null, reservationId: null })
        // Nothing changed: the session before is the session now, and no move closed.
        expect(again.before).toStrictEqual(again.session)
        expect(again.closedMove).toBeNull()
        expect((yield* s.sessionEvents("s1", { limit: 100 })).items).toHaveLength(events)
        yield* expectUnchanged(before, "ending an ended session")
      }),
    ),
    ...(["queued", "pending", "running", "parked", "descending", "descended", "moving", "lost"] as const).map(endCase),
    kase(
      "a state change on an unknown session is NotFound",
      Effect.gen(function* () {
        const s = yield* store
        for (const op of ops) {
          const err = yield* expectFailure(op.run(s, "nope"), "NotFound")
          expect(err).toMatchObject({ entity: "session", id: "nope" })
        }
        yield* expectFailure(s.endSession("nope"), "NotFound")
        yield* expectFailure(s.getSession("nope"), "NotFound")
      }),
    ),
    kase(
      "getSessions reads many sessions at once: each found once, as getSession reads it; unknown ids left out",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 65536)
        yield* sessionIn("a", "running")
        yield* sessionIn("b", "parked")
        yield* sessionIn("q", "queued")
        yield* sessionIn("e", "ended")
        const ids = ["a", "nope", "b", "a", "q", "e", "gone"]
        const got = yield* s.getSessions(ids)
        const byId = [...got].sort((x, y) => (x.id < y.id ? -1 : x.id > y.id ? 1 : 0))
        expect(byId.map((x) => x.id)).toStrictEqual(["a", "b", "e", "q"])
        for (const x of byId) expect(x).toStrictEqual(yield* s.getSession(x.id))
        expect(yield* s.getSessions([])).toStrictEqual([])
        expect(yield* s.getSessions(["nope"])).toStrictEqual([])
        // Many at once (as the coordinator's woken waiters ask): every one answered.
        for (let i = 0; i < 40; i++) yield* s.createSession({ id: `m${i}`, budget: { memMib: 64, vcpus: 1 } })
        const many = Array.from({ length: 40 }, (_, i) => `m${i}`)
        expect(new Set((yield* s.getSessions(many)).map((x) => x.id))).toStrictEqual(new Set(many))
      }),
    ),
    kase(
      "creating the same id with the same budget answers the existing placement",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* addHost("h2", 4096)
        const first = yield* placed("s1", budget)
        yield* s.markRunning("s1")
        const again = yield* s.createSession({ id: "s1", budget })
        expect(again._tag).toBe("Placed")
        expect(again.session).toMatchObject({ state: "running", hostId: first.hostId, reservationId: first.reservationId })
        expect((yield* reservationsNow(s)).length).toBe(1)
        expect((yield* s.metrics()).totalReservedMib).toBe(1024)
      }),
    ),
    kase(
      "creating the same id with another budget is a Conflict on the session",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* placed("s1", budget)
        const before = yield* snapshot
        const err = yield* expectFailure(s.createSession({ id: "s1", budget: { memMib: 2048, vcpus: 1 } }), "Conflict")
        expect(err).toMatchObject({ entity: "session", id: "s1", state: "pending" })
        yield* expectUnchanged(before, "a conflicting create")
      }),
    ),
    kase(
      "repeating a create with another affinity, idle timeout, TTL or template (or refusing to queue a queued session) is a Conflict naming the field, changing nothing; the same options, or fewer, answer the session",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* TestClock.adjust(500)
        const options = { affinity: ["h1", "h2"], idleTimeoutMs: 5000, ttlMs: 60_000, template: "t1" }
        yield* s.createSession({ id: "s1", budget, ...options })
        yield* s.createSession({ id: "bare", budget })
        // A TTL counts from the first create: the same TTL given later is the same.
        yield* TestClock.adjust(1000)
        const before = yield* snapshot
        for (const [id, more, reason] of [
          ["s1", { affinity: ["h2", "h1"] }, "session exists with another affinity (h1, h2)"],
          ["s1", { idleTimeoutMs: 9000 }, "session exists with another idleTimeoutMs (5000)"],
          ["s1", { ttlMs: 1000 }, "session exists with another ttlMs: it ends at 60500, not at its create's time + ttlMs (1500; a TTL counts from the first create, and a new TTL moves it)"],
          ["s1", { template: "t2" }, "session exists with another template (t1)"],
          ["bare", { affinity: ["h1"] }, "session exists with another affinity (none)"],
          ["bare", { idleTimeoutMs: 5000 }, "session exists with another idleTimeoutMs (none)"],
          ["bare", { ttlMs: 1000 }, "session exists with another ttlMs (none: it has no TTL)"],
          ["bare", { template: "t" }, "session exists with another template (none)"],
        ] as const) {
          const err = yield* expectFailure(s.createSession({ id, budget, ...(id === "s1" ? options : {}), ...more }), "Conflict")
          expect([err.entity, err.id, err.state, err.reason], `${id} ${JSON.stringify(more)}`).toStrictEqual(["session", id, "pending", reason])
        }
        yield* expectUnchanged(before, "repeated creates asking for another session")
        expect(yield* s.getSession("bare")).toMatchObject({ affinity: [], idleTimeoutMs: null, endsAt: null, template: null })
        // The same create, or one that leaves options out, answers the session as it is.
        expect((yield* s.createSession({ id: "s1", budget, ...options, onNoRoom: "refuse" })).session).toMatchObject({ id: "s1", state: "pending", endsAt: 60_500 })
        expect((yield* s.createSession({ id: "s1", budget })).session).toMatchObject({ id: "s1", state: "pending" })
        // A queued session is no answer to a create that refuses to queue.
        yield* queued("q1", { memMib: 16384, vcpus: 1 })
        const queuedBefore = yield* snapshot
        const refused = yield* expectFailure(s.createSession({ id: "q1", budget: { memMib: 16384, vcpus: 1 }, onNoRoom: "refuse" }), "Conflict")
        expect([refused.state, refused.reason]).toStrictEqual(["queued", "session exists and is queued: onNoRoom refuse asks for a session that is placed, or none"])
        yield* expectUnchanged(queuedBefore, "a repeated create refusing to queue a queued session")
        expect((yield* s.createSession({ id: "q1", budget: { memMib: 16384, vcpus: 1 } }))._tag).toBe("Queued")
      }),
    ),
    kase(
      "repeating the create of a queued session answers its queue position",
      Effect.gen(function* () {
        const s = yield* store
        yield* queued("q1", budget)
        yield* queued("q2", budget)
        yield* TestClock.adjust(50)
        const again = yield* s.createSession({ id: "q2", budget })
        expect(again).toMatchObject({ _tag: "Queued", position: 2, session: { id: "q2", queuedAt: 0 } })
        expect((yield* queueNow(s)).length).toBe(2)
      }),
    ),
    kase(
      "repeating the create of a descended session is a Conflict naming its state (it is neither placed nor queued: a resume restores it), changing nothing",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* sessionIn("s1", "descended")
        const before = yield* snapshot
        const err = yield* expectFailure(s.createSession({ id: "s1", budget }), "Conflict")
        expect(err).toMatchObject({ entity: "session", id: "s1", state: "descended" })
        expect(err.reason).toBe("session exists and is descended: a create does not restore it (a resume does)")
        yield* expectUnchanged(before, "a repeated create of a descended session")
        expect(yield* s.getSession("s1")).toMatchObject({ state: "descended", hostId: null })
        expect(yield* reservationsNow(s)).toStrictEqual([])
        expect(yield* queueNow(s)).toStrictEqual([])
        // A resume still restores it.
        expect((yield* s.resume("s1"))._tag).toBe("Placed")
      }),
    ),
    kase(
      "repeating the create of a session that ended or was lost is a Conflict naming its state, changing nothing",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        // The repeat a client sends to the next replica after a timeout, once the session has run and ended.
        yield* placed("s1", budget)
        yield* s.markRunning("s1")
        yield* s.endSession("s1")
        yield* sessionIn("s2", "lost")
        for (const [id, state] of [["s1", "ended"], ["s2", "lost"]] as const) {
          const before = yield* snapshot
          const err = yield* expectFailure(s.createSession({ id, budget }), "Conflict")
          expect(err).toMatchObject({ entity: "session", id, state })
          expect(err.reason).toContain(`is ${state}`)
          yield* expectUnchanged(before, `a repeated create of a ${state} session`)
          expect(yield* s.getSession(id)).toMatchObject({ state, hostId: null })
        }
        expect(yield* queueNow(s)).toStrictEqual([])
      }),
    ),
    kase(
      "countSessions counts the sessions in every state but ended, 0 included, as the list holds them",
      Effect.gen(function* () {
        const s = yield* store
        const zero = Object.fromEntries(liveStates.map((st) => [st, 0]))
        expect(yield* s.countSessions()).toStrictEqual(zero)
        yield* addHost("h1", 65536)
        yield* addHost("h2", 65536)
        for (const st of Session.states) yield* sessionIn(`c-${st}`, st)
        yield* placed("c-running-2", budget)
        yield* s.markRunning("c-running-2")
        const tally: Record<string, number> = { ...zero }
        for (const x of yield* s.listSessions()) if (x.state !== "ended") tally[x.state] = (tally[x.state] ?? 0) + 1
        const counts = yield* s.countSessions()
        expect(counts).toStrictEqual(tally)
        for (const st of liveStates) expect(counts[st], st).toBeGreaterThanOrEqual(st === "running" ? 2 : 1)
      }),
    ),
    kase(
      "a session id breaking the id rule is refused naming the field id",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        // SPEC §12: 1-100 of [A-Za-z0-9._-], not . or .. — an id a path can always address.
        for (const id of ["", "has space", "slash/y", "é", "a:b", ".", "..", "x".repeat(101)]) {
          const err = yield* expectFailure(s.createSession({ id, budget }), "InvalidInput")
          expect(err.field).toBe("id")
        }
        expect(yield* s.listSessions()).toStrictEqual([])
        yield* placed(`Ok-1.2_3${"y".repeat(92)}`, budget)
        yield* placed("...", budget)
      }),
    ),
    kase(
      "memMib must be an integer > 0",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const before = yield* snapshot
        for (const memMib of [0, -1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
          const err = yield* expectFailure(s.createSession({ id: "s1", budget: { memMib, vcpus: 1 } }), "InvalidInput")
          expect([err.field, err.rule]).toStrictEqual(["memMib", "must be an integer > 0"])
        }
        yield* expectUnchanged(before, "a bad memMib")
      }),
    ),
    kase(
      "vcpus must be an integer >= 1",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const before = yield* snapshot
        for (const vcpus of [0, -1, 0.5, Number.NaN]) {
          const err = yield* expectFailure(s.createSession({ id: "s1", budget: { memMib: 1024, vcpus } }), "InvalidInput")
          expect(err.field).toBe("vcpus")
          expect(err.rule.length).toBeGreaterThan(0)
        }
        yield* expectUnchanged(before, "a bad vcpus")
      }),
    ),
    kase(
      "affinity must be an array of strings",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const before = yield* snapshot
        for (const affinity of [["h1", 7], "h1", [null]]) {
          const err = yield* expectFailure(
            s.createSession({ id: "s1", budget, affinity: affinity as unknown as readonly string[] }),
            "InvalidInput",
          )
          expect(err.field).toBe("affinity")
        }
        yield* expectUnchanged(before, "a bad affinity")
      }),
    ),
    kase(
      "an affinity of more than maxAffinityHosts (64) hosts, or naming a host twice, is refused naming affinity and the rule, and nothing is stored",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const before = yield* snapshot
        const many = Array.from({ length: 65 }, (_, i) => `h${i}`)
        expect(yield* expectFailure(s.createSession({ id: "s1", budget, affinity: many }), "InvalidInput")).toMatchObject({ field: "affinity", rule: "must be an array of at most 64 host ids" })
        const repeated = Array.from({ length: 50_000 }, () => "h1")
        expect(yield* expectFailure(s.createSession({ id: "s1", budget, affinity: repeated }), "InvalidInput")).toMatchObject({ field: "affinity", rule: "must be an array of at most 64 host ids" })
        expect(yield* expectFailure(s.createSession({ id: "s1", budget, affinity: ["h1", "h2", "h1"] }), "InvalidInput")).toMatchObject({
          field: "affinity.2",
          rule: "must name a host once (it repeats affinity.0)",
        })
        yield* expectUnchanged(before, "creates with too long or repeating affinities")
        // 64 hosts, each once, are kept in their order.
        expect([Validate.maxAffinityHosts, Validate.affinityRule]).toStrictEqual([64, "must be an array of at most 64 host ids"])
        const most = many.slice(1)
        expect((yield* placed("s1", budget, most)).affinity).toStrictEqual(most)
      }),
    ),
    kase(
      "a session remembers its budget and affinity",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        yield* placed("s1", { memMib: 1500, vcpus: 3 }, ["h9", "h1"])
        expect(yield* s.getSession("s1")).toMatchObject({ budget: { memMib: 1500, vcpus: 3 }, affinity: ["h9", "h1"] })
      }),
    ),
    kase(
      "listSessions answers oldest first and filters by state and host",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 2048)
        yield* addHost("h2", 2048)
        yield* placed("b", budget, ["h1"])
        yield* TestClock.adjust(1)
        yield* placed("a", budget, ["h2"])
        yield* s.markRunning("a")
        yield* TestClock.adjust(1)
        yield* placed("c", budget, ["h1"])
        yield* placed("d", budget)
        yield* queued("e", budget)
        expect((yield* s.listSessions()).map((x) => x.id)).toStrictEqual(["b", "a", "c", "d", "e"])
        expect((yield* s.listSessions({ state: "pending" })).map((x) => x.id)).toStrictEqual(["b", "c", "d"])
        expect((yield* s.listSessions({ hostId: "h1" })).map((x) => x.id)).toStrictEqual(["b", "c"])
        expect((yield* s.listSessions({ state: "running", hostId: "h2" })).map((x) => x.id)).toStrictEqual(["a"])
        expect((yield* s.listSessions({ state: "queued" })).map((x) => x.id)).toStrictEqual(["e"])
      }),
    ),
  ],
}
