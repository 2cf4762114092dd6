// The strict-input fuzzers, over real HTTP on the embedded PGlite store and on PostgreSQL:
// - cursors: well-formed page cursors whose keys a list can or cannot hold (fractions, 1e19,
//   1e308, NUL, lone surrogates, other lists' names, wrong lengths) and strings that are no
//   cursor, on every list: never a 5xx; a key the list can hold is a page (200), anything else a
//   400 naming `cursor`;
// - host reports: misspelt and extra keys, allocatableMib above totalMib, odd figures (negative,
//   1e999, past 2^53 - 1, fractional cores, not numbers), alone or together: a 400 naming one of
//   the faulty fields, and nothing changed; a valid report is stored as sent.
import type { RunningCoordinator } from "@engram/coordinator"
import fc from "fast-check"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { InputArbitraries } from "../../src/index.js"
import { backends, settled, unjudged } from "./backends.js"

const ADMIN = "fuzz-strict-admin-token-0123456789"
/** Cases per list and per fuzzer (ENGRAM_FUZZ_RUNS × 10 raises it for a longer hunt). */
const RUNS = Number(process.env["ENGRAM_FUZZ_RUNS"] ?? 8) * 10
const BOUND_MS = 30_000

interface Answer {
  readonly status: number
  readonly body: Record<string, unknown>
}

const call = async (url: string, method: string, path: string, body?: string): Promise<Answer> => {
  const res = await fetch(`${url}${path}`, {
    method,
    headers: { authorization: `Bearer ${ADMIN}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body }),
    signal: AbortSignal.timeout(BOUND_MS),
  })
  const text = await res.text()
  let parsed: unknown = null
  try {
    parsed = JSON.parse(text)
  } catch {
    // judged below: every answer here must be JSON
  }
  expect(typeof parsed === "object" && parsed !== null, `${method} ${path}: not a JSON object: ${text.slice(0, 300)}`).toBe(true)
  return { status: res.status, body: parsed as Record<string, unknown> }
}

/** What a refused request must leave as it was (`unjudged`: what is judged at the read's time left out). */
const snapshot = async (url: string): Promise<string> =>
  JSON.stringify(await Promise.all(["/v1/sessions", "/v1/hosts", "/v1/reservations", "/v1/moves", "/v1/queue"].map(async (p) => unjudged(p, (await call(url, "GET", `${p}?limit=1000`)).body))))

const shorten = (s: string) => (s.length > 300 ? `${s.slice(0, 300)}… (${s.length} chars)` : s)

for (const backend of backends) {
  describe(`the strict-input fuzzers on ${backend.name}`, () => {
    let c: RunningCoordinator
    let done: () => Promise<void>

    beforeAll(async () => {
      ;({ c, done } = await backend.start(ADMIN))
      // Something on every list: hosts, sessions placed and queued (with a history), a reservation, a move.
      for (const id of ["fz-h1", "fz-h2"]) {
        expect((await call(c.url, "POST", "/v1/hosts", JSON.stringify({ id }))).status).toBe(201)
        expect((await call(c.url, "PUT", `/v1/hosts/${id}/report`, JSON.stringify({ totalMib: 8192, allocatableMib: 8192, totalVcpus: 8 }))).status).toBe(200)
      }
      expect((await call(c.url, "POST", "/v1/sessions", JSON.stringify({ id: "fz-s1", memMib: 1024, vcpus: 1, affinity: ["fz-h1"] }))).status).toBe(201)
      expect((await call(c.url, "POST", "/v1/sessions/fz-s1/started")).status).toBe(200)
      expect((await call(c.url, "POST", "/v1/sessions", JSON.stringify({ id: "fz-q1", memMib: 100_000, vcpus: 1 }))).status).toBe(202)
      expect((await call(c.url, "POST", "/v1/reservations", JSON.stringify({ id: "fz-r1", hostId: "fz-h2", ownerKind: "external", ownerId: "fz", memMib: 256, vcpus: 1 }))).status).toBe(201)
    })
    afterAll(async () => {
      await c?.stop()
      await done?.()
    })

    it("cursors on every list: never a 5xx; a key the list holds pages, any other cursor is a 400 naming cursor", { timeout: Math.max(240_000, RUNS * 6 * 500) }, async () => {
      const paths: Record<InputArbitraries.List, string> = {
        sessions: "/v1/sessions",
        moves: "/v1/moves",
        queue: "/v1/queue",
        hosts: "/v1/hosts",
        reservations: "/v1/reservations",
        events: "/v1/sessions/fz-s1/events",
      }
      const seen = { pages: 0, refused: 0 }
      for (const list of Object.keys(paths) as InputArbitraries.List[]) {
        await fc.assert(
          fc.asyncProperty(InputArbitraries.cursor(list), async (k) => {
            const a = await call(c.url, "GET", `${paths[list]}?limit=5&cursor=${encodeURIComponent(k.cursor)}`)
            const what = `${list} cursor ${shorten(k.says)} → ${a.status} ${shorten(JSON.stringify(a.body))}`
            expect(a.status, what).toBeLessThan(500)
            if (k.holds) {
              expect(a.status, what).toBe(200)
              expect(Array.isArray(a.body["items"]), what).toBe(true)
              seen.pages++
            } else {
              expect([a.status, a.body["field"]], what).toEqual([400, "cursor"])
              seen.refused++
            }
          }),
          { numRuns: RUNS, endOnFailure: true },
        )
      }
      // Both kinds were sent on every backend.
      expect(seen.pages).toBeGreaterThan(0)
      expect(seen.refused).toBeGreaterThan(seen.pages)
    })

    it("host reports: misspelt or extra keys, allocatableMib above totalMib, odd figures are a 400 naming one of them, changing nothing; a valid report is stored as sent", { timeout: Math.max(240_000, RUNS * 1000) }, async () => {
      const seen = { accepted: 0, refused: 0 }
      let before = await settled(() => snapshot(c.url))
      await fc.assert(
        fc.asyncProperty(InputArbitraries.report, async (r) => {
          const a = await call(c.url, "PUT", "/v1/hosts/fz-h2/report", r.body)
          const what = `report ${shorten(r.body)} (faults: ${JSON.stringify(r.faults)}) → ${a.status} ${shorten(JSON.stringify(a.body))}`
          if (r.stored !== null) {
            expect(a.status, what).toBe(200)
            expect(a.body["report"], what).toEqual(r.stored)
            seen.accepted++
            // Once settled: a report with more room may start a drain that lands after its answer.
            before = await settled(() => snapshot(c.url))
            return
          }
          expect(a.status, what).toBe(400)
          expect(a.body["error"], what).toBe("InvalidInput")
          expect(r.faults, what).toContain(a.body["field"])
          expect(typeof a.body["rule"] === "string" && a.body["rule"] !== "", what).toBe(true)
          expect(await snapshot(c.url), `a refused report changed something: ${what}`).toBe(before)
          seen.refused++
        }),
        { numRuns: RUNS * 2, endOnFailure: true },
      )
      expect(seen.accepted).toBeGreaterThan(0)
      expect(seen.refused).toBeGreaterThan(0)
    })
  })
}
