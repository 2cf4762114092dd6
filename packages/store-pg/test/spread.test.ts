// Replicas that spread their placements, on a real PostgreSQL: stores placing on one database
// find each other (their connections' `application_name` in `pg_stat_activity`), and each ranks
// its own share of the hosts first (core's `Placement.Spread`), so the same request goes to
// different hosts on different replicas and a burst through both meets no version-check
// conflict. Without the spread both choose the same best-fit host.
import { Limits, Placement } from "@engram/core"
import type { StoreShape } from "@engram/store"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { Effect, Exit } from "effect"
import { afterEach, describe, expect, it } from "vitest"
import type { StorePair } from "../src/StorePg.js"
import { openUrl } from "./open.js"

const limits: Limits.Limits = { ...Limits.defaults, maxEntriesPerNode: 256 }
const budget = { memMib: 512, vcpus: 1 }
const hostIds = Array.from({ length: 12 }, (_, i) => `host-${String(i).padStart(2, "0")}`)

type Opened = { readonly pair: StorePair; readonly close: () => Promise<void> }

/** Twelve equal hosts, registered and reported through `s`. */
const equalHosts = (s: StoreShape) =>
  Effect.runPromise(
    Effect.forEach(hostIds, (id) => Effect.andThen(s.registerHost({ id }), s.reportHost(id, { totalMib: null, allocatableMib: 65_536, totalVcpus: 64 }))),
  )

const hostOf = async (s: StoreShape, id: string): Promise<string> => {
  const outcome = await Effect.runPromise(s.createSession({ id, budget }))
  if (outcome._tag !== "Placed" || outcome.session.hostId === null) throw new Error(`${id} was not placed: ${outcome._tag}`)
  return outcome.session.hostId
}

describe("replicas spreading their placements on PostgreSQL", () => {
  const opened: Opened[] = []
  const dbs: TestDatabase[] = []
  const twoStores = async (spreadPlacements: boolean): Promise<[Opened, Opened]> => {
    const db = await freshDatabase()
    dbs.push(db)
    const a = await openUrl(db.url, { limits, spreadPlacements })
    opened.push(a)
    const b = await openUrl(db.url, { limits, spreadPlacements })
    opened.push(b)
    await equalHosts(a.pair.store)
    // Each store's pool is connected (a fleet read each), then each reads again and sees the other.
    for (let i = 0; i < 2; i++) for (const s of [a, b]) await Effect.runPromise(s.pair.store.fleetView())
    return [a, b]
  }
  afterEach(async () => {
    for (const o of opened.splice(0)) await o.close()
    for (const d of dbs.splice(0)) await d.drop()
  })

  it("two stores find each other and take different shares; the same request goes to a host of each one's own share", async () => {
    const [a, b] = await twoStores(true)
    const spreadA = a.pair.placementSpread()
    const spreadB = b.pair.placementSpread()
    expect(spreadA?.replicas).toBe(2)
    expect(spreadB?.replicas).toBe(2)
    expect(new Set([spreadA?.replica, spreadB?.replica])).toStrictEqual(new Set([0, 1]))
    const onA = await hostOf(a.pair.store, "first-a")
    const onB = await hostOf(b.pair.store, "first-b")
    expect(onA).not.toBe(onB)
    expect(Placement.isOwn(spreadA, onA)).toBe(true)
    expect(Placement.isOwn(spreadB, onB)).toBe(true)
  })

  it("without the spread both stores choose the same best-fit host", async () => {
    const [a, b] = await twoStores(false)
    expect(a.pair.placementSpread()).toBeUndefined()
    expect(b.pair.placementSpread()).toBeUndefined()
    const onA = await hostOf(a.pair.store, "first-a")
    expect(await hostOf(b.pair.store, "first-b")).toBe(onA)
  })

  it("a burst of creates through both stores at once meets no version-check conflict and over-commits nothing", async () => {
    const [a, b] = await twoStores(true)
    const burst = (s: StoreShape, prefix: string) =>
      Effect.all(
        Array.from({ length: 60 }, (_, i) => Effect.exit(s.createSession({ id: `${prefix}-${i}`, budget }))),
        { concurrency: "unbounded" },
      )
    const exits = await Effect.runPromise(Effect.all([burst(a.pair.store, "a"), burst(b.pair.store, "b")], { concurrency: 2 }))
    for (const e of exits.flat()) expect(Exit.isSuccess(e) ? e.value._tag : "failed").toBe("Placed")
    const checks = [a.pair.placementChecks(), b.pair.placementChecks()]
    expect(checks.map((c) => c.conflicts)).toStrictEqual([0, 0])
    expect(checks[0]!.placed + checks[1]!.placed).toBe(120)
    expect(await Effect.runPromise(a.pair.sumsDrift)).toStrictEqual([])
    for (const id of hostIds) {
      const h = await Effect.runPromise(a.pair.store.getHost(id))
      expect(h.headroom.reserved.memMib).toBeLessThanOrEqual(65_536)
    }
  })
})
