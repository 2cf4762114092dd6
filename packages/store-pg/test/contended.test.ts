// A store call that lost to concurrent work on a database that answered is `Unavailable` of kind
// `contended` (a lock wait past lock_timeout, transient conflicts that persisted through the
// retries, a version check that kept losing), so a caller can tell it from an unhealthy store
// (`storeUnhealthy`): the coordinator's leader steps down for the one, not the other.
import { assert, describe, it } from "@effect/vitest"
import { storeUnhealthy, Unavailable } from "@engram/store"
import { Effect } from "effect"
import * as Db from "../src/Db.js"
import * as Pglite from "../src/Pglite.js"

const driverError = (code: string, message: string) => Object.assign(new Error(message), { code })

const failure = (c: Db.Classified): Unavailable => {
  if (c._tag !== "Fail" || !(c.error instanceof Unavailable)) throw new Error(`not Unavailable: ${JSON.stringify(c)}`)
  return c.error
}

describe("contention is told from an unhealthy store", () => {
  it("a lock wait past lock_timeout (55P03) is contended; a lost connection, a timeout and a refused connection are not", () => {
    const locked = failure(Db.classify(driverError("55P03", "canceling statement due to lock timeout")))
    assert.strictEqual(locked.kind, "contended")
    assert.isFalse(storeUnhealthy(locked))
    for (const [code, message] of [
      ["ECONNRESET", "read ECONNRESET"],
      ["08006", "connection failure"],
      ["57014", "canceling statement due to statement timeout"],
      ["ECONNREFUSED", "connect ECONNREFUSED 127.0.0.1:5432"],
    ] as const) {
      const e = failure(Db.classify(driverError(code, message)))
      assert.notStrictEqual(e.kind, "contended", code)
      assert.isTrue(storeUnhealthy(e), code)
    }
  })

  it.effect("a transaction that keeps losing its race under its locks, or whose serialization failures persist, is contended", () =>
    Effect.gen(function* () {
      const db = yield* Pglite.open()
      const races = yield* Effect.flip(db.transaction(() => Effect.fail(new Db.RunAgain({ why: "a row changed under its lock (test)" }))))
      assert.strictEqual(races._tag, "Unavailable")
      assert.strictEqual((races as Unavailable).kind, "contended")
      const conflicts = yield* Effect.flip(db.transaction(() => Effect.fail(new Db.Transient({ code: "40001", message: "could not serialize access (test)" }))))
      assert.strictEqual((conflicts as Unavailable).kind, "contended")
      assert.match((conflicts as Unavailable).reason, /transient conflicts persisted/)
      assert.isFalse(storeUnhealthy(conflicts as Unavailable))
      // A write refused under a newer leader's epoch is no sign of an unhealthy store either.
      assert.isFalse(storeUnhealthy(new Unavailable({ reason: "fenced: lease reaper is at epoch 2, this write was made under epoch 1", retryAfterMs: 1000 })))
    }).pipe(Effect.scoped),
  )
})
