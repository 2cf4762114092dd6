// The incremental fleet read (FleetCache) must answer what a whole read answers: a store that
// has read the fleet many times, while other stores on the same database (other replicas)
// wrote, gives the same fleet view as a store that reads it for the first time. Seeded random
// runs of the operations that change the fleet (hosts, reports, states, removals, creates
// that place or queue, parks, descents, resumes, ends, drains), on PostgreSQL and on PGlite.
import { Limits } from "@engram/core"
import type { FleetRead, StoreShape } from "@engram/store"
import { freshDatabase } from "@engram/test-pg"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { StorePg } from "../src/index.js"
import { Harness } from "@engram/store-conformance"

const limits: Limits.Limits = { ...Limits.defaults, maxEntriesPerNode: 6 }

const prng = (seed: number) => () => {
  seed = (seed + 0x6d2b79f5) | 0
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed)
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}

/** One client: `steps` random operations that change the fleet; refusals are expected and ignored. */
const client = (s: StoreShape, seed: number, steps: number) =>
  Effect.gen(function* () {
    const rnd = prng(seed)
    const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)] as T
    const hosts = Array.from({ length: 8 }, (_, i) => `h${seed % 2}-${i}`)
    const sessions: string[] = ["none"]
    for (let i = 0; i < steps; i++) {
      const r = rnd()
      const sid = pick(sessions)
      const host = pick(hosts)
      const op: Effect.Effect<unknown, unknown> =
        r < 0.08
          ? Effect.andThen(s.registerHost({ id: host }), s.reportHost(host, { totalMib: 16384, allocatableMib: 4096 + 1024 * Math.floor(rnd() * 8), totalVcpus: 4 }))
          : r < 0.12
            ? s.reportHost(host, { totalMib: 16384, allocatableMib: rnd() < 0.2 ? null : 2048 + 1024 * Math.floor(rnd() * 8), totalVcpus: 4 })
            : r < 0.15
              ? s.setHostState(host, pick(["ready", "ready", "cordoned", "draining"] as const))
              : r < 0.17
                ? s.removeHost(host)
                : r < 0.4
                  ? Effect.sync(() => sessions.push(`c${seed}-${i}`)).pipe(
                      Effect.andThen(s.createSession({ id: `c${seed}-${i}`, budget: { memMib: 512 * (1 + Math.floor(rnd() * 8)), vcpus: 1 } })),
                    )
                  : r < 0.52
                    ? s.markRunning(sid)
                    : r < 0.66
                      ? s.idle(sid)
                      : r < 0.72
                        ? s.beginDescent(sid)
                        : r < 0.78
                          ? s.finishDescent(sid)
                          : r < 0.85
                            ? s.resume(sid)
                            : r < 0.92
                              ? s.endSession(sid)
                              : s.drainQueue({ limit: 3 })
      yield* Effect.ignore(op)
    }
  })

const withoutReadAt = (f: FleetRead) => ({ hosts: f.hosts, queue: f.queue })

describe("the incremental fleet read", () => {
  it("answers as a whole read does, after other stores on the same PostgreSQL database wrote between its reads", async () => {
    const db = await freshDatabase()
    try {
      const program = Effect.gen(function* () {
        const a = yield* StorePg.openUrl({ url: db.url, limits, poolSize: 4 })
        const b = yield* StorePg.openUrl({ url: db.url, limits, poolSize: 4 })
        const reader = yield* StorePg.openUrl({ url: db.url, limits, poolSize: 2 })
        let reads = 0
        for (let round = 0; round < 6; round++) {
          // Writers on two stores, and the reader reading the fleet while they write.
          yield* Effect.all(
            [
              client(a.store, 100 + round * 2, 60),
              client(b.store, 101 + round * 2, 60),
              Effect.forEach(Array.from({ length: 10 }), () => Effect.map(reader.store.fleetView(), () => reads++), { discard: true }),
            ],
            { concurrency: "unbounded" },
          )
          const fresh = yield* StorePg.openUrl({ url: db.url, limits, poolSize: 1 })
          const whole = yield* fresh.store.fleetView()
          const incremental = yield* reader.store.fleetView()
          expect(withoutReadAt(incremental)).toStrictEqual(withoutReadAt(whole))
        }
        // Whether the random rounds left a park depends on how the two writers interleaved: a
        // last round parks one for certain (a host with room of its own, a session placed on it
        // and idled), between the reader's reads, so the incremental read must take in a park. The
        // queue is ended first: the default park policy parks no session while one waits without room.
        for (const q of yield* a.store.listSessions({ state: "queued" })) yield* a.store.endSession(q.id)
        yield* a.store.registerHost({ id: "hpark" })
        yield* a.store.reportHost("hpark", { totalMib: 65536, allocatableMib: 65536, totalVcpus: 64 })
        yield* a.store.setHostState("hpark", "ready")
        yield* b.store.createSession({ id: "parked-last", budget: { memMib: 512, vcpus: 1 }, affinity: ["hpark"] })
        yield* b.store.markRunning("parked-last")
        expect((yield* b.store.idle("parked-last")).state).toBe("parked")
        const fleet = yield* reader.store.fleetView()
        const whole = yield* (yield* StorePg.openUrl({ url: db.url, limits, poolSize: 1 })).store.fleetView()
        expect(withoutReadAt(fleet)).toStrictEqual(withoutReadAt(whole))
        expect(fleet.hosts.some((h) => h.parks.some((k) => k.sessionId === "parked-last"))).toBe(true)
        expect(reads).toBeGreaterThan(0)
      })
      await Effect.runPromise(Effect.scoped(program))
    } finally {
      await db.drop()
    }
  }, 180_000)

  it("answers what the store's own lists say on PGlite, between writes and after a reset", async () => {
    // PGlite has one writer per database, so the whole read to compare with is the lists'.
    const agrees = (s: StoreShape) =>
      Effect.gen(function* () {
        const fleet = yield* s.fleetView()
        const views = yield* Harness.hostsNow(s)
        expect(fleet.hosts.map((h) => [h.id, h.headroom, h.state, h.entries, h.descentsRunning])).toStrictEqual(
          views.map((h) => [h.id, h.headroom, h.state, h.entries, h.descentsRunning]),
        )
        const parked = yield* s.listSessions({ state: "parked" })
        for (const h of fleet.hosts)
          expect(h.parks.map((k) => k.sessionId).sort()).toStrictEqual(parked.filter((x) => x.hostId === h.id).map((x) => x.id).sort())
        expect(fleet.queue.map((q) => q.sessionId)).toStrictEqual((yield* Harness.queueNow(s)).map((x) => x.id))
        return fleet
      })
    const program = Effect.gen(function* () {
      const p = yield* StorePg.openPglite({ limits })
      let parks = 0
      for (let round = 0; round < 5; round++) {
        yield* client(p.store, 300 + round, 80)
        const fleet = yield* agrees(p.store)
        parks += fleet.hosts.reduce((n, h) => n + h.parks.length, 0)
      }
      expect(parks).toBeGreaterThan(0)
      yield* p.testing.reset(limits)
      expect(withoutReadAt(yield* p.store.fleetView())).toStrictEqual({ hosts: [], queue: [] })
      yield* client(p.store, 400, 80)
      yield* agrees(p.store)
    })
    await Effect.runPromise(Effect.scoped(program))
  }, 300_000)
})
