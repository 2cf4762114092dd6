// The coordinator while its PostgreSQL is away: a real PostgreSQL behind a proxy the
// test stalls (a silent partition: nothing answers, no error comes) or cuts (the database
// refuses): every request answers 503 with Retry-After and a JSON body within the store bound,
// /readyz says not ready, the process stays up, and once the database is back the same
// requests succeed without a restart. A write acknowledged around a cut is there afterwards.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { freshDatabase, startProxyFor } from "@engram/test-pg"
import type { CuttableProxy, TestDatabase } from "@engram/test-pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { call, client, listAll } from "./support/http.js"
import type { Answer, Client } from "./support/http.js"

let db: TestDatabase
let proxy: CuttableProxy
let c: RunningCoordinator
let admin: Client

beforeAll(async () => {
  db = await freshDatabase()
  const through = await startProxyFor(db.url)
  proxy = through.proxy
  c = await startCoordinator({
    reaper: false,
    logLevel: "None",
    config: { port: 0, databaseUrl: through.url, adminToken: "outage-admin-token-0123456789", storeTimeoutMs: 2000 },
  })
  admin = client(c.url, c.adminToken)
  expect((await admin.post("/v1/hosts", { id: "h1" })).status).toBe(201)
  expect((await admin.put("/v1/hosts/h1/report", { totalMib: 1 << 20, allocatableMib: 1 << 20, totalVcpus: 1024 })).status).toBe(200)
})

afterAll(async () => {
  await c?.stop()
  await proxy?.close()
  await db?.drop()
})

/** The answer, or "no answer" once `ms` passed: a hang detector, not a timing check. */
const answered = <A>(p: Promise<A>, ms = 30_000): Promise<A | "no answer"> =>
  Promise.race([p, new Promise<"no answer">((resolve) => setTimeout(() => resolve("no answer"), ms).unref())])

let n = 0
/** The requests an outage must not hang: each is a fresh write or a read. */
const requests = (): readonly (readonly [string, () => Promise<Answer>])[] => {
  const k = n++
  return [
    ["create", () => admin.post("/v1/sessions", { id: `s-${k}`, memMib: 64, vcpus: 1 })],
    ["host report", () => admin.put("/v1/hosts/h1/report", { totalMib: 1 << 20, allocatableMib: 1 << 20, totalVcpus: 1024 })],
    ["host heartbeat", () => admin.post("/v1/hosts/h1/heartbeat")],
    ["reserve", () => admin.post("/v1/reservations", { id: `r-${k}`, hostId: "h1", ownerKind: "external", ownerId: "job", memMib: 64, vcpus: 1 })],
    ["ledger summary", () => admin.get("/v1/ledger/summary")],
    ["fleet", () => admin.get("/v1/fleet")],
    ["session list", () => admin.get("/v1/sessions?limit=5")],
  ]
}

/**
 * A request as a client retries it: again after a 503 (as its Retry-After says), a few times.
 * Once the database is back the first tries may still meet a connection being re-established
 * on a loaded machine; a retry is what the 503 asks for.
 */
const retried = async (r: () => Promise<Answer>): Promise<Answer> => {
  let a = await r()
  // Up to about 30 s in all: a connection re-established on a machine the whole suite loads (5 s
  // was a guess such a machine can overrun; a client that meets the database back stops at once).
  for (let i = 0; i < 60 && a.status === 503; i++) {
    await new Promise((resolve) => setTimeout(resolve, 500))
    a = await r()
  }
  return a
}

/** Runs every request at once; answers `name → status` and checks each unavailable answer's shape. */
const runAll = async (expectUnavailable: boolean) => {
  const list = requests()
  const answers = await Promise.all(list.map(([, r]) => answered(expectUnavailable ? r() : retried(r))))
  const statuses: Record<string, number | "no answer"> = {}
  for (const [i, [name]] of list.entries()) {
    const a = answers[i]!
    statuses[name] = a === "no answer" ? a : a.status
    if (expectUnavailable && a !== "no answer" && a.status === 503) {
      expect(Number(a.headers.get("retry-after")), name).toBeGreaterThan(0)
      expect(a.headers.get("content-type"), name).toContain("json")
      expect(a.body, name).toMatchObject({ error: "Unavailable", message: expect.any(String), retryAfterMs: expect.any(Number) })
    }
  }
  return statuses
}

const readyz = () => call(c.url, "GET", "/readyz")

const untilReady = async () => {
  for (let i = 0; i < 600; i++) {
    if ((await readyz()).status === 200) return
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  throw new Error("the coordinator never became ready again")
}

const allUnavailable = (names: Record<string, unknown>) => Object.fromEntries(Object.keys(names).map((k) => [k, 503]))

describe("the coordinator while its PostgreSQL is away", () => {
  it("a silent partition: every request answers 503 with Retry-After and a JSON body (none hangs), /readyz is not ready; once it heals, 2xx again without a restart", async () => {
    expect((await readyz()).status).toBe(200)
    proxy.stall(true)
    try {
      const during = await runAll(true)
      expect(during).toStrictEqual(allUnavailable(during))
      const ready = await answered(readyz())
      expect(ready === "no answer" ? ready : ready.status).toBe(503)
      // The process is alive throughout: liveness needs no database.
      expect((await call(c.url, "GET", "/livez")).status).toBe(200)
    } finally {
      proxy.stall(false)
    }
    await untilReady()
    const after = await runAll(false)
    for (const [name, status] of Object.entries(after)) expect([200, 201, 202], name).toContain(status)
  })

  it("the database refusing and its connections reset: 503s with Retry-After, /readyz not ready; 2xx once it is back", async () => {
    proxy.refuse(true)
    proxy.cut()
    try {
      const during = await runAll(true)
      expect(during).toStrictEqual(allUnavailable(during))
      const ready = await answered(readyz())
      expect(ready === "no answer" ? ready : ready.status).toBe(503)
    } finally {
      proxy.refuse(false)
    }
    await untilReady()
    const after = await runAll(false)
    for (const [name, status] of Object.entries(after)) expect([200, 201, 202], name).toContain(status)
  })

  it("a burst of creates cut in the middle: each answers (acknowledged or 503), and every acknowledged one is stored", async () => {
    const ids = Array.from({ length: 48 }, (_, i) => `burst-${i}`)
    let first = false
    const answers = ids.map((id) =>
      answered(
        admin.post("/v1/sessions", { id, memMib: 64, vcpus: 1 }).then((a) => {
          if (!first) {
            first = true
            proxy.cut()
          }
          return a
        }),
      ),
    )
    const outcomes = await Promise.all(answers)
    expect(outcomes.filter((o) => o === "no answer")).toStrictEqual([])
    const statuses = outcomes.map((o) => (o === "no answer" ? 0 : o.status))
    expect(statuses.filter((s) => ![201, 202, 503].includes(s))).toStrictEqual([])
    await untilReady()
    const stored = new Set((await listAll<{ id: string }>(admin, "/v1/sessions")).map((s) => s.id))
    const acknowledged = ids.filter((_, i) => statuses[i] === 201 || statuses[i] === 202)
    expect(acknowledged.length).toBeGreaterThan(0)
    for (const id of acknowledged) expect(stored.has(id), id).toBe(true)
  })
})
