/**
 * coordinator bench: sustained session creates per second and p50/p99 latency over real HTTP
 * (64 requests in flight, admin token, JSON), next to the store's own placements per second on
 * the same backend in the same run (the same workload straight through `Store.createSession`,
 * 64 in flight). The ratio is what the HTTP layer, auth and encoding cost on top of the store.
 * Backends: embedded PostgreSQL (@engram/test-pg) and PGlite in a temp dir.
 */
import { report } from "@engram/bench"
import { Limits } from "@engram/core"
import { Store } from "@engram/store"
import { StorePg } from "@engram/store-pg"
import { createDatabase, startEmbeddedPostgres } from "@engram/test-pg"
import { Context, Effect, Layer } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { startCoordinator } from "../src/index.js"

const HOSTS = 16
const IN_FLIGHT = 64
// Every session fits: the bench measures the placement path, not the queue.
const limits = (() => {
  const r = Limits.make({ maxEntriesPerNode: 100_000 })
  if (r._tag === "Invalid") throw new Error("bad bench limits")
  return r.limits
})()
const report0 = { totalMib: 4_194_304, allocatableMib: 4_194_304, totalVcpus: 1024 }
const budget = (i: number) => ({ memMib: 128 * (1 + (i % 8)), vcpus: 1 + (i % 2) })

const bounded = async (n: number, task: (i: number) => Promise<void>) => {
  let next = 0
  await Promise.all(
    Array.from({ length: IN_FLIGHT }, async () => {
      while (next < n) await task(next++)
    }),
  )
}

const pct = (sorted: readonly number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))] ?? 0

/** The store alone: placements per second with IN_FLIGHT concurrent creates. */
const storeRate = async (layer: Layer.Layer<Store, unknown>, n: number): Promise<number> =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const ctx = yield* Layer.build(layer)
        const store = Context.get(ctx, Store)
        for (let h = 0; h < HOSTS; h++) {
          yield* store.registerHost({ id: `h${h}` })
          yield* store.reportHost(`h${h}`, report0)
        }
        const t0 = performance.now()
        yield* Effect.forEach(Array.from({ length: n }, (_, i) => i), (i) => store.createSession({ id: `s${i}`, budget: budget(i) }), {
          concurrency: IN_FLIGHT,
          discard: true,
        })
        return n / ((performance.now() - t0) / 1000)
      }),
    ),
  )

/** Over HTTP: creates per second and latency percentiles. */
const httpRate = async (start: () => ReturnType<typeof startCoordinator>, n: number) => {
  const c = await start()
  try {
    const headers = { authorization: `Bearer ${c.adminToken}`, "content-type": "application/json" }
    for (let h = 0; h < HOSTS; h++) {
      await fetch(`${c.url}/v1/hosts`, { method: "POST", headers, body: JSON.stringify({ id: `h${h}` }) })
      await fetch(`${c.url}/v1/hosts/h${h}/report`, { method: "PUT", headers, body: JSON.stringify(report0) })
    }
    const latencies: number[] = []
    let failures = 0
    const t0 = performance.now()
    await bounded(n, async (i) => {
      const s = performance.now()
      const res = await fetch(`${c.url}/v1/sessions`, { method: "POST", headers, body: JSON.stringify({ id: `s${i}`, ...budget(i) }) })
      await res.arrayBuffer()
      if (res.status !== 201) failures++
      latencies.push(performance.now() - s)
    })
    const rate = n / ((performance.now() - t0) / 1000)
    latencies.sort((a, b) => a - b)
    return { rate, p50: pct(latencies, 50), p99: pct(latencies, 99), failures }
  } finally {
    await c.stop()
  }
}

const run = async (backend: string, n: number, storeLayer: () => Layer.Layer<Store, unknown>, start: () => ReturnType<typeof startCoordinator>) => {
  const baseline = await storeRate(storeLayer(), n)
  const http = await httpRate(start, n)
  const bench = "coordinator"
  report({ bench, figure: `${backend}: store placements/s (${IN_FLIGHT} in flight)`, value: baseline, unit: "/s" })
  report({ bench, figure: `${backend}: HTTP session creates/s (${IN_FLIGHT} in flight)`, value: http.rate, unit: "/s", ratio: http.rate / baseline, baseline: "store placements/s" })
  report({ bench, figure: `${backend}: HTTP create latency p50`, value: http.p50, unit: "ms" })
  report({ bench, figure: `${backend}: HTTP create latency p99`, value: http.p99, unit: "ms" })
  if (http.failures > 0) console.log(`${backend}: ${http.failures} creates were not 201`)
}

const main = async () => {
  const pg = await startEmbeddedPostgres()
  try {
    await run(
      "postgres",
      3000,
      () => Layer.unwrap(Effect.promise(() => createDatabase(pg.url)).pipe(Effect.map((db) => StorePg.layer({ url: db.url, limits })))),
      async () => {
        const db = await createDatabase(pg.url)
        return startCoordinator({ reaper: false, logLevel: "Warn", config: { port: 0, databaseUrl: db.url, adminToken: "bench-admin-token-0123456789", limits } })
      },
    )
  } finally {
    await pg.stop()
  }
  const dirs: string[] = []
  const dir = () => {
    const d = mkdtempSync(join(tmpdir(), "engram-coordinator-bench-"))
    dirs.push(d)
    return d
  }
  try {
    await run(
      "pglite",
      1000,
      () => StorePg.layerPglite({ dataDir: join(dir(), "pglite"), limits }),
      () => startCoordinator({ reaper: false, logLevel: "Warn", config: { port: 0, dataDir: dir(), adminToken: "bench-admin-token-0123456789", limits } }),
    )
  } finally {
    for (const d of dirs) rmSync(d, { recursive: true, force: true })
  }
}

await main()
