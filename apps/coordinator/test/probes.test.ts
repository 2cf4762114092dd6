// The probes while the store does not answer at all (PostgreSQL SIGSTOPped): /readyz answers 503
// within its own short bound (ENGRAM_PROBE_TIMEOUT_MS), naming a readiness check, and /metrics
// answers without the store's figures (`engram_store_up 0`) within that bound too, not after the
// store's bound (ENGRAM_STORE_TIMEOUT_MS, here far longer: a probe that waited it out would fail
// on its message, not on time).
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import * as StoreModule from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Effect, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client } from "./support/http.js"

const adminToken = "probes-admin-token-0123456789"
let frozen = false
let c: RunningCoordinator

beforeAll(async () => {
  c = await startCoordinator({
    // The reads the probes make never answer while `frozen`.
    store: Layer.effect(
      StoreModule.Store,
      Effect.gen(function* () {
        const store = yield* StoreModule.Store
        return StoreModule.Store.of({
          ...store,
          metrics: () => (frozen ? Effect.never : store.metrics()),
          fleetView: () => (frozen ? Effect.never : store.fleetView()),
          countSessions: () => (frozen ? Effect.never : store.countSessions()),
        })
      }),
    ).pipe(Layer.provide(StoreSim.layer())),
    reaper: false,
    logLevel: "None",
    config: { port: 0, adminToken, storeTimeoutMs: 20_000, probeTimeoutMs: 50 },
  })
})
afterAll(() => c?.stop())

/** The answer, or "no answer" once `ms` passed: a hang detector (the store's bound is 20 s, a scrape waited it out twice), not a timing check. */
const answered = <A>(p: Promise<A>, ms = 10_000): Promise<A | "no answer"> =>
  Promise.race([p, new Promise<"no answer">((resolve) => setTimeout(() => resolve("no answer"), ms).unref())])

describe("the probes with a store that does not answer", () => {
  it("/readyz answers 503 within ENGRAM_PROBE_TIMEOUT_MS naming the readiness check; /metrics answers engram_store_up 0 without the store's figures", async () => {
    const anyone = client(c.url)
    const scraper = client(c.url, adminToken)
    expect((await anyone.get("/readyz")).status).toBe(200)
    const before = await scraper.get<string>("/metrics")
    expect(before.body).toMatch(/^engram_store_up 1$/m)
    expect(before.body).toMatch(/^engram_hosts 0$/m)
    expect(before.body).toMatch(/^engram_sessions\{state="lost"\} 0$/m)
    frozen = true
    try {
      const ready = await anyone.get("/readyz")
      expect(ready.status).toBe(503)
      expect(ready.body.message).toBe("store unavailable: the store did not answer a readiness check within 50 ms (ENGRAM_PROBE_TIMEOUT_MS)")
      expect(ready.headers.get("retry-after")).not.toBeNull()
      const scrape = await answered(scraper.get<string>("/metrics"))
      if (scrape === "no answer") expect.fail("/metrics did not answer within 10 s (a scrape is lost after Prometheus's default 10 s)")
      expect(scrape.status).toBe(200)
      expect(scrape.body).toMatch(/^engram_store_up 0$/m)
      expect(scrape.body).not.toMatch(/^engram_hosts /m)
      expect(scrape.body).not.toMatch(/^engram_sessions\{/m)
      // The process's own figures are there all the same.
      expect(scrape.body).toMatch(/^process_resident_memory_bytes /m)
    } finally {
      frozen = false
    }
    expect((await anyone.get("/readyz")).status).toBe(200)
  })
})
