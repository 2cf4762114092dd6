// The end-to-end suite on a real PostgreSQL (@engram/test-pg), leader lock included.
import { startCoordinator } from "@engram/coordinator"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { afterAll, describe, expect, it } from "vitest"
import { client } from "./support/http.js"
import { apiSuite } from "./suite.js"

const databases: TestDatabase[] = []
afterAll(async () => {
  for (const d of databases) await d.drop()
})

apiSuite("PostgreSQL", {
  coordinator: async (o) => {
    const db = await freshDatabase()
    databases.push(db)
    return {
      reaper: false,
      logLevel: "Warn",
      config: {
        port: 0,
        databaseUrl: db.url,
        adminToken: "postgres-admin-token-0123456789",
        // The suite drives passes by hand right after start: no failover grace (grace.test.ts has its own).
        reclaimGraceMs: 0,
        ...(o?.moveTimeoutMs === undefined ? {} : { moveTimeoutMs: o.moveTimeoutMs }),
      },
    }
  },
})

describe("one bad create never fails valid creates sent beside it (PostgreSQL)", () => {
  it("200 concurrent creates over HTTP, 24 of them bad: every bad one is a 400 naming its field, every good one is stored, none is a 500", async () => {
    const db = await freshDatabase()
    databases.push(db)
    const c = await startCoordinator({ reaper: false, logLevel: "Error", config: { port: 0, databaseUrl: db.url, adminToken: "postgres-admin-token-0123456789" } })
    try {
      const admin = client(c.url, c.adminToken)
      for (const id of ["ha", "hb", "hc"]) {
        await admin.post("/v1/hosts", { id })
        await admin.put(`/v1/hosts/${id}/report`, { totalMib: 65536, allocatableMib: 33792, totalVcpus: 32 })
      }
      const bad = (i: number): { readonly body: Record<string, unknown>; readonly field: string } => {
        switch (i % 6) {
          case 0:
            return { body: { id: `bad-${i}`, memMib: 256, vcpus: 1, affinity: ["ha", "x\u0000y"] }, field: "affinity.1" }
          case 1:
            return { body: { id: `bad-${i}`, memMib: 256, vcpus: 1, affinity: ["\ud800"] }, field: "affinity.0" }
          case 2:
            return { body: { id: `b${"x".repeat(100)}${i}`, memMib: 256, vcpus: 1 }, field: "id" }
          case 3:
            return { body: { id: "..", memMib: 256, vcpus: 1 }, field: "id" }
          case 4:
            return { body: { id: `bad:${i}`, memMib: 256, vcpus: 1 }, field: "id" }
          default:
            return { body: { id: `bad-${i}`, memMib: 256, vcpus: 1, affinity: ["hb\ud83d"] }, field: "affinity.0" }
        }
      }
      const requests = Array.from({ length: 200 }, (_, i) =>
        i % 25 < 3 ? { kind: "bad" as const, ...bad(i) } : { kind: "good" as const, body: { id: `good-${i}`, memMib: 256, vcpus: 1, affinity: [["ha", "hb", "hc"][i % 3]] }, field: "" },
      )
      const answers = await Promise.all(requests.map((r) => admin.raw("POST", "/v1/sessions", JSON.stringify(r.body))))
      const statuses = answers.map((a) => a.status)
      expect(statuses.filter((s) => s >= 500)).toEqual([])
      for (const [i, r] of requests.entries()) {
        const a = answers[i]!
        if (r.kind === "bad") expect([a.status, a.body.field], JSON.stringify(r.body)).toEqual([400, r.field])
        else expect([201, 202], `${String(r.body.id)}: ${JSON.stringify(a.body)}`).toContain(a.status)
      }
      const good = requests.filter((r) => r.kind === "good").map((r) => String(r.body.id)).sort()
      expect(good).toHaveLength(176)
      const stored: string[] = []
      let cursor: string | null = null
      do {
        const page: { body: { items: { id: string }[]; nextCursor: string | null } } = await admin.get(`/v1/sessions?limit=1000${cursor === null ? "" : `&cursor=${cursor}`}`)
        stored.push(...page.body.items.map((x) => x.id))
        cursor = page.body.nextCursor
      } while (cursor !== null)
      expect(stored.sort()).toEqual(good)
    } finally {
      await c.stop()
    }
  }, 120_000)
})
