// A store call that times out behind a lock says whose lock it is: a real PostgreSQL, an
// operator's session holding `LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE` idle in its
// transaction, a create that waits on it past the store bound (503), and one warning naming
// the holder's pid, its state and its query, with the query's literals masked.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { logged } from "./support/http.js"
import { until, withOperator, written } from "./support/operator.js"
import type { OperatorFixture } from "./support/operator.js"

let f: OperatorFixture

beforeAll(async () => {
  f = await withOperator({ adminToken: "lockwait-admin-token-0123456789", storeTimeoutMs: 4000, logLevel: "Warn", connections: 1 })
})

afterAll(async () => {
  await f?.stop()
})

describe("a store call timed out behind a lock", () => {
  it("answers 503 in the one wording, and one warning names the lock's holder: pid, application, state, its query masked", async () => {
    const { admin, db, operator } = f
    const held = await operator.reserve()
    try {
      const [{ pid }] = (await held`select pg_backend_pid() as pid`) as unknown as [{ pid: number }]
      await held.unsafe("begin")
      await held.unsafe("lock table sessions in access exclusive mode")
      // The holder's last statement carries a literal that must not reach the log.
      await held.unsafe("select 'hunter2-secret' as note")
      const { result, lines } = await logged(async () => {
        const r = await admin.post("/v1/sessions", { id: "s-locked", memMib: 64, vcpus: 1 })
        // `logged` hands the lines over at the end; the warning is written off the request, so wait for it here.
        await until(() => written().includes("wait on a lock held by pid"))
        return r
      })
      expect(result.status).toBe(503)
      expect(result.body.message).toContain("the database did not answer createSession within 4000 ms (ENGRAM_STORE_TIMEOUT_MS)")
      const warnings = lines
        .split("\n")
        .filter((l) => l.includes("wait on a lock held by pid"))
        .map((l) => JSON.parse(l) as { level: string; msg: string; lockHolders: number[] })
      expect(warnings, lines).toHaveLength(1)
      expect(warnings[0]).toMatchObject({ level: "warn", lockHolders: [pid] })
      const warning = warnings[0]!.msg
      expect(warning).toContain(`held by pid ${pid}`)
      expect(warning).toContain(`application "psql-operator"`)
      expect(warning).toContain("idle in transaction")
      expect(warning).toContain("select '…' as note")
      expect(warning).not.toContain("hunter2")
      expect(lines).not.toContain(db.url)
    } finally {
      await held.unsafe("rollback").catch(() => undefined)
      held.release()
    }
    // The lock gone, the same create succeeds.
    expect((await f.admin.post("/v1/sessions", { id: "s-after", memMib: 64, vcpus: 1 })).status).toBe(201)
  })
})
