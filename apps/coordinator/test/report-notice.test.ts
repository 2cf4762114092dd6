// A host report sends the fleet's room notice (and starts a drain) only when the store says it
// changed the host's figures (`ReportedHost.figuresChanged`): an agent re-reporting the same
// figures every interval costs no notice (each one a transaction of its own on PostgreSQL).
import { Notifier, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Topic } from "@engram/store"
import { Effect } from "effect"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client } from "./support/http.js"

const adminToken = "report-notice-admin-token-0123456789"

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

  /** Whether a fleet notice arrives while `act` runs (the waiter is registered before it starts). */
  const noticed = async (act: () => Promise<unknown>, waitMs: number): Promise<boolean> => {
    const woken = c.run(Effect.flatMap(Effect.service(Notifier), (n) => n.wait([Topic.fleet], waitMs)))
    await act()
    return woken
  }

  it("the first report and a changed one notify; the same figures again do not", async () => {
    const admin = client(c.url, adminToken)
    expect((await admin.post("/v1/hosts", { id: "rn-h1" })).status).toBe(201)
    const report = (allocatableMib: number) => async () => {
      const r = await admin.put("/v1/hosts/rn-h1/report", { totalMib: 16384, allocatableMib, totalVcpus: 8 })
      expect(r.status).toBe(200)
      expect(r.body.report.allocatableMib).toBe(allocatableMib)
    }
    expect(await noticed(report(12288), 20_000)).toBe(true)
    // Nothing else notifies the fleet here (no reaper): a notice within a second would be this report's.
    expect(await noticed(report(12288), 1000)).toBe(false)
    expect(await noticed(report(8192), 20_000)).toBe(true)
  })
})
