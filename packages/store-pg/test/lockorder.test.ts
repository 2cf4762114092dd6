// One lock order in every transaction of the store: ending a session and
// committing or aborting its move both lock the session before the move, a reclaim locks
// sessions before reservations, and a release across hosts locks the hosts in id order. Raced
// on a real PostgreSQL, they never wait on each other in a circle: the server detects no
// deadlock (each would cost a second of `deadlock_timeout` and a retry), and every pair settles.
import { Limits } from "@engram/core"
import type { StoreShape } from "@engram/store"
import { freshDatabase } from "@engram/test-pg"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { StorePg } from "../src/index.js"
import { Harness } from "@engram/store-conformance"

const limits: Limits.Limits = { ...Limits.defaults, heartbeatStaleWindowMs: 60_000 }
const final = { kind: "final", wireBytes: 1000, apparentBytes: 2000, sendMs: 10, captureMs: 5 } as const
const phases = { downtimeMs: 500, captureMs: 40, sendMs: 60, commitMs: 380 }

/** `n` running sessions spread over hosts a and b, each with an open move to the other host whose final round is recorded. */
const movingSessions = (s: StoreShape, prefix: string, n: number) =>
  Effect.gen(function* () {
    const out: { sessionId: string; moveId: string }[] = []
    for (let i = 0; i < n; i++) {
      const sessionId = `${prefix}${i}`
      const host = i % 2 === 0 ? "a" : "b"
      yield* s.createSession({ id: sessionId, budget: { memMib: 256, vcpus: 1 }, affinity: [host] })
      yield* s.markRunning(sessionId)
      const move = yield* s.beginMove({ sessionId, targetHostId: host === "a" ? "b" : "a", maxDowntimeMs: 600 })
      yield* s.recordRound(move.id, final)
      out.push({ sessionId, moveId: move.id })
    }
    return out
  })

describe("one lock order (PostgreSQL)", () => {
  it("ends racing commits and aborts of their moves, and ends of moves crossing between two hosts, deadlock never", async () => {
    const db = await freshDatabase()
    try {
      const program = Effect.gen(function* () {
        const pair = yield* StorePg.openUrl({ url: db.url, limits, poolSize: 24 })
        const s = pair.store
        for (const id of ["a", "b"]) {
          yield* s.registerHost({ id })
          yield* s.reportHost(id, { totalMib: 1 << 20, allocatableMib: 1 << 19, totalVcpus: 64 })
        }
        for (let round = 0; round < 4; round++) {
          const racing = yield* movingSessions(s, `r${round}-`, 16)
          // Each session's end races its own move's commit or abort; crossing moves make the ends
          // release entries on both hosts.
          yield* Effect.all(
            racing.flatMap((m, i) => [
              Effect.result(s.endSession(m.sessionId)),
              Effect.result(i % 2 === 0 ? s.commitMove(m.moveId, phases) : s.abortMove(m.moveId, "racing an end")),
            ]),
            { concurrency: "unbounded" },
          )
          for (const m of racing) {
            expect((yield* s.getSession(m.sessionId)).state).toBe("ended")
            expect((yield* s.getMove(m.moveId)).state).not.toBe("pending")
          }
        }
        expect(yield* Harness.reservationsNow(s)).toStrictEqual([])
        expect(yield* pair.sumsDrift).toStrictEqual([])
        expect(pair.conflicts().deadlocks).toBe(0)
      })
      await Effect.runPromise(Effect.scoped(program))
    } finally {
      await db.drop()
    }
  }, 240_000)
})
