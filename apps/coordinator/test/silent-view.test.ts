// What an operator sees of hosts whose agent went silent and of the change listener, over real
// HTTP: `GET /v1/fleet` counts the silent hosts and names their room, `/metrics` has
// `engram_hosts_silent` and `engram_change_listener_up`, `GET /v1/hosts` flags each silent host.
// A silent host is made without a sleep: its report is written by a store whose clock runs ten
// minutes behind (the stale window is two). The listener gauge on PostgreSQL: its LISTEN
// connection goes through a proxy the test cuts.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { StorePg, ChangesPg } from "@engram/store-pg"
import { StoreSim } from "@engram/store-sim"
import { freshDatabase, startProxyFor } from "@engram/test-pg"
import type { CuttableProxy, TestDatabase } from "@engram/test-pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { shiftedLayer } from "./support/clock.js"
import type { Shift } from "./support/clock.js"
import { client } from "./support/http.js"

const adminToken = "silent-view-admin-token-0123456789"
const tenMinutesMs = 10 * 60_000

/** A gauge's value in a scrape, or undefined when absent. */
const gauge = (text: string, name: string): number | undefined => {
  const m = new RegExp(`^${name} (\\S+)$`, "m").exec(text)
  return m === null ? undefined : Number(m[1])
}

describe("silent hosts as the operator sees them", () => {
  const shift: Shift = { ms: 0 }
  let c: RunningCoordinator
  beforeAll(async () => {
    c = await startCoordinator({ store: shiftedLayer(StoreSim.layer(), shift), reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
  })
  afterAll(() => c?.stop())

  it("GET /v1/fleet counts the silent hosts and names their room; the gauge; each host says silent; its next report ends it", async () => {
    const admin = client(c.url, adminToken)
    const report = (id: string, allocatableMib: number) => admin.put(`/v1/hosts/${id}/report`, { totalMib: allocatableMib, allocatableMib, totalVcpus: 4 })
    for (const id of ["dead", "live"]) expect((await admin.post("/v1/hosts", { id })).status).toBe(201)
    // dead's agent last reported ten minutes ago (the store's clock behind); live's reports now.
    shift.ms = -tenMinutesMs
    expect((await report("dead", 9216)).status).toBe(200)
    shift.ms = 0
    expect((await report("live", 5120)).status).toBe(200)
    expect((await admin.post("/v1/sessions", { id: "s1", memMib: 1024, vcpus: 1 })).body.hostId).toBe("live")

    const fleet = (await admin.get("/v1/fleet")).body
    // ready keeps its meaning (every ready host); the silent ones beside it, and their part of the room.
    expect(fleet.hosts).toEqual({ total: 2, ready: 2, measured: 2, cordoned: 0, draining: 0, silent: 1, readySilent: 1 })
    expect([fleet.freeMib, fleet.silentFreeMib]).toEqual([8192 + 3072, 8192])
    expect([fleet.freeVcpus, fleet.silentFreeVcpus]).toEqual([31, 16])

    const metrics = (await admin.get("/metrics")).body as string
    expect(gauge(metrics, "engram_hosts_silent")).toBe(1)
    expect(metrics).toContain("# HELP engram_hosts_silent ")
    // One process, its notices in memory: nothing to lose, always up.
    expect(gauge(metrics, "engram_change_listener_up")).toBe(1)

    const listed = (await admin.get("/v1/hosts")).body.items as { id: string; silent: boolean }[]
    expect(listed.map((h) => [h.id, h.silent])).toEqual([
      ["dead", true],
      ["live", false],
    ])
    expect((await admin.get("/v1/hosts/dead")).body).toMatchObject({ id: "dead", state: "ready", silent: true })

    // Its agent reports again: no longer silent, anywhere.
    expect((await report("dead", 9216)).body.silent).toBe(false)
    expect((await admin.get("/v1/fleet")).body).toMatchObject({ hosts: { silent: 0, readySilent: 0 }, silentFreeMib: 0, silentFreeVcpus: 0 })
    expect(gauge((await admin.get("/metrics")).body as string, "engram_hosts_silent")).toBe(0)
  })
})

describe("engram_change_listener_up on PostgreSQL", () => {
  let db: TestDatabase
  let proxy: CuttableProxy
  let c: RunningCoordinator
  beforeAll(async () => {
    db = await freshDatabase()
    const through = await startProxyFor(db.url)
    proxy = through.proxy
    // The store on the database directly; only the LISTEN connection crosses the proxy.
    c = await startCoordinator({
      store: StorePg.layer({ url: db.url }),
      changes: ChangesPg.layer({ url: through.url, checkMs: 200 }),
      reaper: false,
      logLevel: "Error",
      config: { port: 0, adminToken },
    })
  })
  afterAll(async () => {
    await c?.stop()
    await proxy?.close()
    await db?.drop()
  })

  /** The gauge, scraped until it reads `value` (a condition, not a time). */
  const until = async (value: number): Promise<number | undefined> => {
    const admin = client(c.url, adminToken)
    let seen: number | undefined
    for (let i = 0; i < 2000; i++) {
      seen = gauge((await admin.get("/metrics")).body as string, "engram_change_listener_up")
      if (seen === value) break
      await new Promise((r) => setTimeout(r, 10))
    }
    return seen
  }

  it("1 while the LISTEN connection is established, 0 while it cannot reconnect, 1 again once it has", async () => {
    expect(await until(1)).toBe(1)
    proxy.refuse(true)
    proxy.cut()
    expect(await until(0)).toBe(0)
    proxy.refuse(false)
    expect(await until(1)).toBe(1)
  })
})
