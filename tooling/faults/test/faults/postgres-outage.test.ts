// PostgreSQL goes away three times under a running load of creates and ends: stopped (fast
// shutdown: clients are told "terminating connection due to administrator command") and started
// again on the same data, then cut off (a proxy resets every connection and refuses new ones, as a
// partition does), then stopped and started again. During each outage every
// request is answered quickly with a JSON 503 and a Retry-After; after it, writes succeed again
// without a restart; the coordinator process lives throughout; and the checker finds every
// acknowledged create stored once, no host over capacity, the maintained sums equal to the
// reservations, nothing placed twice.
import { createDatabase, startProxyFor, type CuttableProxy, type TestDatabase } from "@engram/test-pg"
import { afterAll, beforeAll, describe, expect, it, onTestFailed } from "vitest"
import { History, Load, Observe, PgServer, Processes } from "../../src/index.js"
import { ADMIN_TOKEN, capacities, expectNoViolations, registerHosts, tally } from "./fixture.js"

let pg: PgServer.RestartablePostgres
let db: TestDatabase
let proxy: CuttableProxy
let coordinator: Processes.CoordinatorProcess

beforeAll(async () => {
  // A server of its own: this scenario stops it.
  pg = await PgServer.startRestartablePostgres()
  db = await createDatabase(pg.server.url, { prefix: "faults_outage" })
  const through = await startProxyFor(db.url)
  proxy = through.proxy
  coordinator = await Processes.startCoordinatorProcess({
    ENGRAM_DATABASE_URL: through.url,
    ENGRAM_ADMIN_TOKEN: ADMIN_TOKEN,
    ENGRAM_DATA_DIR: Processes.tempDir("outage"),
    ENGRAM_REAPER_INTERVAL_MS: "1000",
  })
})

afterAll(async () => {
  await Processes.killAll()
  await proxy?.close()
  await pg?.close()
})

describe("PostgreSQL stopped and started under load", () => {
  it("stopped, partitioned, stopped: 503s with Retry-After during each, 2xx after, the coordinator alive, and the history checks out", async () => {
    // Where the scenario got to, with times: printed with the coordinator's log if it fails
    // (a timeout of the whole test says nothing of where it stood).
    const t0 = Date.now()
    const progress: string[] = []
    const step = (what: string) => progress.push(`${((Date.now() - t0) / 1000).toFixed(1)} s: ${what}`)
    await registerHosts(coordinator.url, "outage-host", 3, 4096)
    const caps = await capacities(coordinator.url)
    const observer = Observe.sqlObserver(db.url, caps)
    const sampler = Observe.startSampler(observer.sample)
    const recorder = new History.Recorder(coordinator.url, ADMIN_TOKEN)
    onTestFailed(() => {
      console.error(`postgres-outage progress:\n${progress.join("\n")}\nops: ${tally(recorder.ops)}\nunanswered: ${JSON.stringify(recorder.ops.filter((o) => o.status === null).slice(0, 20))}\ncoordinator output:\n${coordinator.output().slice(-20_000)}`)
    })
    const load = Load.startLoad(recorder, { prefix: "outage", workers: 4, memMib: 512, endEvery: 3 })
    // Beside the sessions, what an agent and an operator do: report, heartbeat, read the ledger,
    // hold and release an external reservation (the calls issue 13 saw hang during an outage).
    let hostWork = true
    // The agent's and operator's calls in a loop; asked to stop, it finishes with one whole
    // round the store answered (the database is back by then), so each call is seen served.
    // A reservation may be refused (409: the sessions filled the hosts): that is the store's
    // answer too, not an outage.
    // Asked to stop, it gives the store 60 s to answer a whole round; past that it stops and the
    // checks below say which calls were never served (rather than the test's own timeout).
    let stopBy = Number.POSITIVE_INFINITY
    let lastRound: readonly History.Op[] = []
    const storeAnswered = (o: History.Op) => o.status !== null && o.status < 500
    const hostWorker = (async () => {
      for (let i = 0; ; i++) {
        const host = `outage-host-${i % 3}`
        const ops = [
          await recorder.call("other", host, "PUT", `/v1/hosts/${host}/report`, { totalMib: 5120, allocatableMib: 5120, totalVcpus: 8 }),
          await recorder.call("other", host, "POST", `/v1/hosts/${host}/heartbeat`),
          await recorder.call("read", null, "GET", "/v1/ledger/summary"),
        ]
        const held = await recorder.call("other", `outage-ext-${i}`, "POST", "/v1/reservations", { id: `outage-ext-${i}`, hostId: host, ownerKind: "external", ownerId: "outage", memMib: 64, vcpus: 0 })
        ops.push(held)
        if (History.acknowledged(held)) ops.push(await recorder.call("other", `outage-ext-${i}`, "DELETE", `/v1/reservations/outage-ext-${i}`))
        if (!hostWork && (ops.every(storeAnswered) || Date.now() > stopBy)) {
          lastRound = ops
          break
        }
        if (!ops.every(History.acknowledged)) await new Promise((r) => setTimeout(r, 100))
      }
    })()
    const stopHostWork = async () => {
      hostWork = false
      stopBy = Date.now() + 60_000
      await hostWorker
    }
    const acksAfter = (t: number) => recorder.ops.filter((o) => o.startMs > t && History.acknowledged(o)).length
    const answeredAfter = (t: number) => recorder.ops.filter((o) => o.startMs > t && o.status !== null).length
    try {
      await Load.until("the first acknowledged writes", () => acksAfter(0) >= 20)
      step("first acknowledged writes")
      const windows: { readonly from: number; readonly to: number }[] = []
      const kinds = ["stopped", "partitioned", "stopped"] as const
      for (const [outage, kind] of kinds.entries()) {
        // Down: the server stopped, or new connections refused and every open one reset. The
        // window starts once it is down and ends before it comes back up.
        step(`outage ${outage + 1} (${kind}): going down`)
        if (kind === "stopped") await pg.stop()
        else {
          proxy.refuse(true)
          proxy.cut()
        }
        const from = Date.now()
        step(`outage ${outage + 1}: down`)
        await Load.until(
          `answers during outage ${outage + 1}`,
          () => {
            // A 500 breaks the contract at once: say so without waiting out the bound.
            const broken = recorder.ops.find((o) => o.status !== null && o.status >= 500 && o.status !== 503)
            if (broken !== undefined) throw new Error(`${broken.method} ${broken.path} → ${broken.status} ${JSON.stringify(broken.response)}`)
            return answeredAfter(from) >= 8
          },
          90_000,
        ).catch((e: unknown) => {
          throw new Error(`${String(e)} (${kind}); since it went down: ${tally(recorder.ops.filter((o) => o.startMs > from))} ("none": no answer within ${recorder.boundMs} ms)`)
        })
        step(`outage ${outage + 1}: answered during`)
        expect(coordinator.alive(), coordinator.output()).toBe(true)
        // Up again: writes are acknowledged without a restart of the coordinator.
        const to = Date.now()
        if (kind === "stopped") await pg.start()
        else proxy.refuse(false)
        windows.push({ from, to })
        step(`outage ${outage + 1}: up again`)
        await Load.until(`acknowledged writes after outage ${outage + 1}`, () => acksAfter(to) >= 8, 90_000)
        step(`outage ${outage + 1}: writes acknowledged after`)
      }
      step("stopping the load")
      await load.stop()
      step("stopping the host work")
      await stopHostWork()
      step("stopped")
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
      // The agent's and operator's calls were served outside the outages: the store answered them
      // (a 2xx, or a 4xx of the ledger's own rules such as a full host; never only 503s).
      const served: readonly (readonly [string, RegExp])[] = [
        ["PUT", /\/report$/],
        ["POST", /\/heartbeat$/],
        ["GET", /^\/v1\/ledger\/summary$/],
        ["POST", /^\/v1\/reservations$/],
        ["DELETE", /^\/v1\/reservations\//],
      ]
      // A release is sent only for a reservation that was made (none while the hosts are full).
      const made = recorder.ops.some((o) => o.method === "POST" && /^\/v1\/reservations$/.test(o.path) && History.acknowledged(o))
      for (const [method, path] of served.filter(([m]) => m !== "DELETE" || made)) expect(recorder.ops.some((o) => o.method === method && path.test(o.path) && storeAnswered(o)), `${method} ${path}: ${tally(recorder.ops.filter((o) => o.method === method && path.test(o.path)))}`).toBe(true)
      // After the last outage the store serves the whole round again (a call that stays a 503
      // once the database is back is one the coordinator lost hold of).
      expect(lastRound.filter((o) => !storeAnswered(o)).map((o) => `${o.method} ${o.path} → ${o.status} ${JSON.stringify(o.response)}`)).toEqual([])
      // Every request got an answer (none hit the 20 s bound or a reset).
      expect(recorder.ops.filter((o) => o.status === null)).toEqual([])
      expect(recorder.ops.filter((o) => o.status !== null && o.status >= 500 && o.status !== 503)).toEqual([])

      const observation = { ...(await observer.observe()), samples: sampler.samples }
      expect(sampler.samples.length).toBeGreaterThan(0)
      expectNoViolations(recorder.ops, observation)
      // ENGRAM_FAULTS_PROGRESS=1 prints the timeline of a passing run too (to see how close to its bounds it ran).
      if (process.env.ENGRAM_FAULTS_PROGRESS) console.log(`postgres-outage progress:\n${progress.join("\n")}\nops: ${tally(recorder.ops)}`)
    } finally {
      await load.stop()
      await stopHostWork()
      await sampler.stop()
      await observer.close()
    }
  })
})
