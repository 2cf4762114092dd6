// What a driver error means (`Db.classify`): a full disk and the server's timeouts are
// `Unavailable` (503, retry), never a defect (500).
import { DrizzleQueryError } from "drizzle-orm/errors"
import { describe, expect, it } from "vitest"
import * as Db from "../src/Db.js"

/** A driver error as postgres.js and PGlite throw it, wrapped by drizzle. */
const driverError = (code: string, message: string) => {
  const cause = Object.assign(new Error(message), { code })
  return Object.assign(new Error(`Failed query: insert …`), { cause })
}

describe("Db.classify", () => {
  it("a full disk (53100, or ENOSPC) is Unavailable of kind disk_full, naming the cause", () => {
    for (const e of [driverError("53100", 'could not extend file "base/5/16468": No space left on device'), Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC" })]) {
      const c = Db.classify(e)
      expect(c._tag).toBe("Fail")
      if (c._tag !== "Fail") return
      expect(c.error).toMatchObject({ _tag: "Unavailable", kind: "disk_full" })
      expect((c.error as { reason: string }).reason).toMatch(/^disk full: .*no space left on device/i)
    }
  })

  it("a database that only reads (25006: a hot standby, default_transaction_read_only) is Unavailable of kind read_only, naming the cause", () => {
    const c = Db.classify(driverError("25006", "cannot execute INSERT in a read-only transaction"))
    expect(c).toMatchObject({ _tag: "Fail", error: { _tag: "Unavailable", kind: "read_only" } })
    expect(c._tag === "Fail" && (c.error as { reason: string }).reason).toMatch(/refuses writes \(read-only\): 25006: cannot execute INSERT in a read-only transaction/)
  })

  it("the server's statement_timeout is a timeout (kind timed_out, as the coordinator's own bound); a cancel by hand is not", () => {
    expect(Db.classify(driverError("57014", "canceling statement due to statement timeout"))).toMatchObject({ _tag: "Fail", error: { _tag: "Unavailable", kind: "timed_out" } })
    const byHand = Db.classify(driverError("57014", "canceling statement due to user request"))
    expect(byHand).toMatchObject({ _tag: "Fail", error: { _tag: "Unavailable" } })
    expect(byHand._tag === "Fail" && (byHand.error as { kind?: string }).kind).toBeUndefined()
  })

  it("the server's statement and idle-in-transaction timeouts are Unavailable", () => {
    for (const code of ["57014", "25P03"]) expect(Db.classify(driverError(code, "canceling statement due to statement timeout"))).toMatchObject({ _tag: "Fail", error: { _tag: "Unavailable" } })
  })

  it("a defect or an unavailable database keeps no statement parameter (drizzle's message, PGlite's error): token hashes and ids stay out of logs and answers", () => {
    const secret = "3f9a1c0ffee0d15ea5e5ecre7hash"
    const query = "update hosts set token_hash = $1 where id = $2"
    // PGlite puts the statement and its parameters on its error; drizzle wraps it, parameters in its message.
    const pglite = Object.assign(new Error('relation "hosts" does not exist'), { code: "42P01", query, params: [secret, "h-1"] })
    const defect = Db.classify(new DrizzleQueryError(query, [secret, "h-1"], pglite))
    expect(defect._tag).toBe("Defect")
    const error = (defect as { error: Error }).error
    expect(error.message).toBe(`Failed query: ${query}: relation "hosts" does not exist`)
    expect((error as { code?: string }).code).toBe("42P01")
    expect(JSON.stringify(error)).not.toContain(secret)
    expect(`${error.stack} ${String(error.cause)} ${JSON.stringify(Object.entries(error))}`).not.toContain(secret)
    // No SQLSTATE, a closed handle: Unavailable, its reason without the parameters.
    const closed = Db.classify(new DrizzleQueryError(query, [secret], new Error("PGlite is closed")))
    expect(closed).toMatchObject({ _tag: "Fail", error: { _tag: "Unavailable" } })
    expect((closed as { error: { reason: string } }).error.reason).not.toContain(secret)
    // An error with no parameters is the same error.
    const plain = Object.assign(new Error("boom"), { code: "XX000" })
    expect(Db.classify(plain)).toEqual({ _tag: "Defect", error: plain })
  })
})
