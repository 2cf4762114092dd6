// A host report sends the fleet's room notice (and starts a drain) only when the store says it
// changed the host's figures (`ReportedHost.figuresChanged`): an agent re-reporting the same
// figures every interval costs no notice (each one a transaction of its own on PostgreSQL).
import { Notifier, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Limits } from "@engram/core"
import { Topic } from "@engram/store"
import { Effect } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client } from "./support/http.js"

const adminToken = "report-notice-admin-token-0123456789"

/** Whether a fleet notice arrives at `c` while `act` runs (the waiter is registered before it starts). */
const noticed = async (c: RunningCoordinator, act: () => Promise<unknown>, waitMs: number): Promise<boolean> => {
  const woken = c.run(Effect.flatMap(Effect.service(Notifier), (n) => n.wait([Topic.fleet], waitMs)))
  await act()
  return woken
}

describe("report notices", () => {
  let dir: string
  let c: RunningCoordinator
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "engram-report-notice-"))
    c = await startCoordinator({ reaper: false, logLevel: "Error", config: { port: 0, dataDir: dir, adminToken } })
  })
  afterAll(async () => {
    await c?.stop()
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true })
  })


  it("the first report and a changed one notify; the same figures again do not", async () => {
    const admin = client(c.url, adminToken)
    expect((await admin.post("/v1/hosts", { id: "rn-h1" })).status).toBe(201)
    const report = (allocatableMib: number) => async () => {
      const r = await admin.put("/v1/hosts/rn-h1/report", { totalMib: 16384, allocatableMib, totalVcpus: 8 })
      expect(r.status).toBe(200)
      expect(r.body.report.allocatableMib).toBe(allocatableMib)
    }
    expect(await noticed(c, report(12288), 20_000)).toBe(true)
    // Nothing else notifies the fleet here (no reaper): a notice within a second would be this report's.
    expect(await noticed(c, report(12288), 1000)).toBe(false)
    expect(await noticed(c, report(8192), 20_000)).toBe(true)
  })
})

describe("a silent host's report", () => {
  // A short stale window: a host whose agent has not reported for longer takes no placement.
  // After the report that ends the silence, the drain must place the queued session before the
  // window passes again (nothing reports after it): a few seconds, for PGlite on a loaded machine.
  const windowMs = 3000
  let dir: string
  let c: RunningCoordinator
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "engram-report-silent-"))
    c = await startCoordinator({
      reaper: false,
      logLevel: "Error",
      config: { port: 0, dataDir: dir, adminToken, limits: { ...Limits.defaults, heartbeatStaleWindowMs: windowMs } },
    })
  })
  afterAll(async () => {
    await c?.stop()
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true })
  })

  it("a create queues with the reason silent; the host's next report (the same figures) ends the silence, notifies and drains the queue onto it", async () => {
    const admin = client(c.url, adminToken)
    expect((await admin.post("/v1/hosts", { id: "rs-h1" })).status).toBe(201)
    const report = async () => expect((await admin.put("/v1/hosts/rs-h1/report", { totalMib: 16384, allocatableMib: 12288, totalVcpus: 8 })).status).toBe(200)
    await report()
    // The agent falls silent for longer than the window (a wall-clock wait: the coordinator runs on the real clock).
    await new Promise((r) => setTimeout(r, windowMs + 100))
    const q = await admin.post("/v1/sessions", { id: "rs-q", memMib: 1024, vcpus: 1 })
    expect(q.status, JSON.stringify(q.body)).toBe(202)
    expect(q.body.noFit).toEqual([{ hostId: "rs-h1", reason: "silent", freeMib: 11264, freeVcpus: 32 }])
    // The same figures again: no change but the silence's end, which wakes the drain.
    expect(await noticed(c, report, 20_000)).toBe(true)
    let state = ""
    for (let i = 0; i < 200 && state !== "pending"; i++) {
      state = (await admin.get("/v1/sessions/rs-q")).body.state
      if (state !== "pending") await new Promise((r) => setTimeout(r, 50))
    }
    expect((await admin.get("/v1/sessions/rs-q")).body).toMatchObject({ state: "pending", hostId: "rs-h1" })
  })
})
