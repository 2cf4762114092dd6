// A request its client gave up on while the store had not answered is seen on the coordinator's
// side: a real PostgreSQL where an operator's session holds host h1's row (`SELECT … FOR UPDATE`,
// idle in its transaction), an agent-like client whose report waits on it and hangs up before
// the store bound, and the coordinator logs it (info: route, how long, the store call it waited
// on) and counts it (`engram_http_requests_abandoned_total{method,route}`). Before, nothing.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { logged } from "./support/http.js"
import { report, until, withOperator, written } from "./support/operator.js"
import type { OperatorFixture } from "./support/operator.js"

let f: OperatorFixture

beforeAll(async () => {
  // The store's bound far past the client's patience: the client leaves first, as an agent whose
  // heartbeat interval is under the store's 15 s.
  f = await withOperator({ adminToken: "abandoned-admin-token-0123456789", storeTimeoutMs: 60_000, logLevel: "Info", connections: 2 })
})

afterAll(async () => {
  await f?.stop()
})

describe("a request its client left while the store had not answered", () => {
  it("is logged at info with its route, how long, and the store call it waited on, and counted by route", async () => {
    const { admin, c, operator } = f
    const held = await operator.reserve()
    try {
      await held.unsafe("begin")
      await held.unsafe("select id from hosts where id = 'h1' for update")
      const { lines } = await logged(async () => {
        const leave = new AbortController()
        const sent = fetch(`${c.url}/v1/hosts/h1/report`, {
          method: "PUT",
          headers: { authorization: `Bearer ${c.adminToken}`, "content-type": "application/json" },
          body: JSON.stringify(report),
          signal: leave.signal,
        }).catch((e: unknown) => e)
        // The client hangs up once its report waits on the row lock (seen on the database), as an agent past its bound.
        const waiting = await until(async () => {
          const [row] = await operator<{ n: number }[]>`select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and datname = current_database() and application_name <> 'psql-operator'`
          return (row?.n ?? 0) > 0
        })
        expect(waiting, "the report waits on the lock").toBe(true)
        leave.abort()
        expect(await sent).toBeInstanceOf(Error)
        await until(() => written().includes("the client left before the answer"))
      })
      const line = lines
        .split("\n")
        .filter((l) => l.includes("the client left before the answer"))
        .map((l) => JSON.parse(l) as Record<string, unknown>)
      expect(line, lines).toHaveLength(1)
      expect(line[0]).toMatchObject({ level: "info", method: "PUT", route: "/v1/hosts/:id/report", operation: "reportHost" })
      expect(String(line[0]!["msg"])).toMatch(/^the client left before the answer, after \d+ ms: the store had not answered reportHost \(waiting \d+ ms of ENGRAM_STORE_TIMEOUT_MS\)$/)
    } finally {
      await held.unsafe("rollback").catch(() => undefined)
      held.release()
    }
    const metrics = await admin.get<string>("/metrics")
    expect(metrics.body).toContain('engram_http_requests_abandoned_total{method="PUT",route="/v1/hosts/:id/report"} 1')
    // The lock gone, the same report lands.
    expect((await admin.put("/v1/hosts/h1/report", report)).status).toBe(200)
  })
})
