// PostgreSQL goes away three times under a running load of creates and ends (every connection
// reset, new ones refused, as a server restart or a partition does it). During each outage every
// request is answered quickly with a JSON 503 and a Retry-After; after it, writes succeed again
// without a restart; the coordinator process lives throughout; and the checker finds every
// acknowledged create stored once, no host over capacity, the maintained sums equal to the
// reservations, nothing placed twice.
import { freshDatabase, startCuttableProxy, type CuttableProxy, type TestDatabase } from "@engram/test-pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { History, Load, Observe, Processes } from "../../src/index.js"
import { ADMIN_TOKEN, capacities, expectNoViolations, registerHosts, tally } from "./fixture.js"

let db: TestDatabase
let proxy: CuttableProxy
let coordinator: Processes.CoordinatorProcess

beforeAll(async () => {
  db = await freshDatabase({ prefix: "faults_outage" })
  const target = new URL(db.url)
  proxy = await startCuttableProxy({ host: target.hostname, port: Number(target.port) })
  const viaProxy = new URL(db.url)
  viaProxy.port = String(proxy.port)
  coordinator = await Processes.startCoordinatorProcess({
    ENGRAM_DATABASE_URL: viaProxy.toString(),
    ENGRAM_ADMIN_TOKEN: ADMIN_TOKEN,
    ENGRAM_DATA_DIR: Processes.tempDir("outage"),
    ENGRAM_REAPER_INTERVAL_MS: "1000",
  })
})

afterAll(async () => {
  await Processes.killAll()
  await proxy?.close()
  await db?.drop()
})

describe("PostgreSQL stopped and started under load", () => {
  it("three outages: 503s with Retry-After during each, 2xx after, the coordinator alive, and the history checks out", async () => {
    await registerHosts(coordinator.url, "outage-host", 3, 4096)
    const caps = await capacities(coordinator.url)
    const observer = Observe.sqlObserver(db.url, caps)
    const sampler = Observe.startSampler(observer.sample)
    const recorder = new History.Recorder(coordinator.url, ADMIN_TOKEN)
    const load = Load.startLoad(recorder, { prefix: "outage", workers: 4, memMib: 512, endEvery: 3 })
    const acksAfter = (t: number) => recorder.ops.filter((o) => o.startMs > t && History.acknowledged(o)).length
    const answeredAfter = (t: number) => recorder.ops.filter((o) => o.startMs > t && o.status !== null).length
    try {
      await Load.until("the first acknowledged writes", () => acksAfter(0) >= 20)
      const windows: { readonly from: number; readonly to: number }[] = []
      for (let outage = 0; outage < 3; outage++) {
        // Down: new connections are refused and every open one is reset.
        proxy.refuse(true)
        proxy.cut()
        const from = Date.now()
        await Load.until(
          `answers during outage ${outage + 1}`,
          () => {
            // A 500 breaks the contract at once: say so without waiting out the bound.
            const broken = recorder.ops.find((o) => o.status !== null && o.status >= 500 && o.status !== 503)
            if (broken !== undefined) throw new Error(`${broken.method} ${broken.path} → ${broken.status} ${JSON.stringify(broken.response)}`)
            return answeredAfter(from) >= 8
          },
          90_000,
        )
        expect(coordinator.alive(), coordinator.output()).toBe(true)
        // Up again: writes are acknowledged without a restart.
        proxy.refuse(false)
        const to = Date.now()
        windows.push({ from, to })
        await Load.until(`acknowledged writes after outage ${outage + 1}`, () => acksAfter(to) >= 8, 90_000)
      }
      await load.stop()
      await sampler.stop()
      expect(coordinator.alive(), coordinator.output()).toBe(true)

      for (const [i, w] of windows.entries()) {
        // Requests sent while the database was away and answered before it came back.
        const during = recorder.ops.filter((o) => o.startMs > w.from && o.endMs < w.to)
        expect(during.length, `outage ${i + 1}: ${tally(recorder.ops)}`).toBeGreaterThan(0)
        for (const op of during) {
          expect({ status: op.status, error: (op.response as { error?: unknown } | null)?.error }, `${op.method} ${op.path} during outage ${i + 1}`).toEqual({ status: 503, error: "Unavailable" })
          expect(Number(op.retryAfter)).toBeGreaterThan(0)
        }
      }
      // Every request got an answer (none hit the 20 s bound or a reset).
      expect(recorder.ops.filter((o) => o.status === null)).toEqual([])
      expect(recorder.ops.filter((o) => o.status !== null && o.status >= 500 && o.status !== 503)).toEqual([])

      const observation = { ...(await observer.observe()), samples: sampler.samples }
      expect(sampler.samples.length).toBeGreaterThan(0)
      expectNoViolations(recorder.ops, observation)
    } finally {
      await load.stop()
      await sampler.stop()
      await observer.close()
    }
  })
})
