// What a driver error means (`Db.classify`): a full disk and the server's timeouts are
// `Unavailable` (503, retry), never a defect (500).
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
})
