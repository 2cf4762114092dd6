// The dashboard's change feed reads the fleet once per change, however many dashboards wait:
// the version (a hash of one fleet read and the pending moves) read since the last change notice
// answers every poll. Before, each open poll read the fleet when it opened and again at each
// change: N dashboard tabs cost N fleet reads per change. Real HTTP, a real coordinator on the
// in-memory store, its store calls counted.
import { Notifier, startCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { Effect } from "effect"
import { describe, expect, it, vi } from "vitest"
import { counting } from "./support/counting.js"
import { client } from "./support/http.js"

const adminToken = "ui-version-once-admin-token-0123456789"

describe("the dashboard's /ui/changes", () => {
  it("reads the fleet once per change for ten waiting dashboards, and each sees the new version", async () => {
    const { layer, counts } = counting(StoreSim.layer())
    const c = await startCoordinator({ store: layer, reaper: false, logLevel: "None", config: { port: 0, adminToken } })
    try {
      const admin = client(c.url, adminToken)
      const registered = await admin.post("/v1/hosts", { id: "h-new" })
      expect(registered.status).toBe(201)
      const first = await admin.get("/ui/changes?since=&waitMs=0")
      expect(first.status).toBe(200)
      const reads = () => counts.byName.get("fleetView") ?? 0
      const before = reads()
      const path = `/ui/changes?since=${encodeURIComponent(first.body.version as string)}&waitMs=20000`
      const polls = Array.from({ length: 10 }, () => admin.get(path))
      await vi.waitFor(async () => expect(await c.run(Effect.map(Effect.service(Notifier), (n) => n.watching()))).toBeGreaterThanOrEqual(10), { timeout: 10_000, interval: 20 })
      // Nothing changed since the first read: the ten polls opened on it (before: ten reads).
      expect(reads() - before).toBe(0)
      // The change: the host reports its size.
      expect((await client(c.url, registered.body.token as string).put("/v1/hosts/h-new/report", { totalMib: 65536, allocatableMib: 65536, totalVcpus: 16 })).status).toBe(200)
      const answers = await Promise.all(polls)
      const versions = new Set(answers.map((a) => a.body.version as string))
      expect(answers.map((a) => a.status)).toEqual(Array(10).fill(200))
      expect(versions.size).toBe(1)
      expect(versions.has(first.body.version as string)).toBe(false)
      // One read for the change (a second notice of it, as a registration may send, reads once more).
      expect(reads() - before).toBeLessThanOrEqual(2)
    } finally {
      await c.stop()
    }
  })
})
