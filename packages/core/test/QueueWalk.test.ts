import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Headroom, Limits, ParkPolicy, Placement, PlacementIndex, QueueWalk } from "../src/index.js"
import type { Budget, Candidate } from "../src/index.js"
import { arbBudget, arbFleet, hostIds } from "./arb.js"

interface Q {
  readonly id: string
  readonly budget: Budget
  readonly affinity: readonly string[]
}

const arbQueue = fc
  .array(fc.record({ budget: arbBudget, affinity: fc.array(fc.constantFrom(...hostIds), { maxLength: 2 }) }), { maxLength: 25 })
  .map((qs) => qs.map((q, i): Q => ({ id: `q${i}`, ...q })))

const host = (id: string, capacityMib: number): Candidate => ({
  id,
  headroom: { allocatableMib: capacityMib, cpuBudget: 64, reserved: { memMib: 0, vcpus: 0 } },
})
const gib = (n: number): Q => ({ id: `${n}g`, budget: { memMib: n * 1024, vcpus: 1 }, affinity: [] })

describe("the queue walk", () => {
  it("places in FIFO order, each placement taking its room before the next is judged", () => {
    const walk = QueueWalk.walk([gib(3), gib(3), gib(3)].map((q, i) => ({ ...q, id: `q${i}` })), [host("h1", 7168), host("h2", 3072)])
    expect(walk.placed.map((p) => [p.waiting.id, p.hostId])).toStrictEqual([
      ["q0", "h2"],
      ["q1", "h1"],
      ["q2", "h1"],
    ])
    expect(walk.unplaced).toStrictEqual([])
  })

  it("a session that fits nowhere keeps its place while a later, smaller one passes it", () => {
    const walk = QueueWalk.walk([gib(8), gib(1)], [host("h1", 4096)])
    expect(walk.placed.map((p) => p.waiting.id)).toStrictEqual(["1g"])
    expect(walk.unplaced.map((q) => q.id)).toStrictEqual(["8g"])
  })

  it("stops at the limit: later sessions are neither placed nor judged", () => {
    const queue = [gib(1), gib(1), gib(1)].map((q, i) => ({ ...q, id: `q${i}` }))
    const walk = QueueWalk.walk(queue, [host("h1", 65536)], { limit: 2 })
    expect(walk.placed.map((p) => p.waiting.id)).toStrictEqual(["q0", "q1"])
    expect(walk.unplaced).toStrictEqual([])
  })

  it("property: never over-commits, places each session at most once, each placement where it fits at its turn", () => {
    fc.assert(
      fc.property(arbFleet, arbQueue, fc.option(fc.integer({ min: 0, max: 30 }), { nil: undefined }), (hosts, queue, limit) => {
        const limits = { ...Limits.defaults, maxEntriesPerNode: 6 }
        const walk = QueueWalk.walk(queue, hosts, { limit }, limits)
        const ids = [...walk.placed.map((p) => p.waiting.id), ...walk.unplaced.map((q) => q.id)]
        expect(new Set(ids).size).toBe(ids.length)
        if (limit !== undefined) expect(walk.placed.length).toBeLessThanOrEqual(limit)
        // Replay by hand: each placement fits the host as the placements before it left it.
        const room = new Map(hosts.map((h) => [h.id, h]))
        let k = 0
        for (const q of queue) {
          const p = walk.placed[k]
          if (p !== undefined && p.waiting === q) {
            const c = room.get(p.hostId) as Candidate
            expect(Placement.fitsOn(c, q.budget, limits)).toBe(true)
            // The walk takes the host core's pick would take now.
            expect(p.hostId).toBe(Placement.pick([...room.values()], { budget: q.budget, affinity: q.affinity }, limits))
            room.set(p.hostId, QueueWalk.withReservation(c, q.budget))
            k++
          } else if (walk.unplaced.includes(q)) {
            expect(Placement.pick([...room.values()], { budget: q.budget }, limits)).toBeNull()
          }
        }
        expect(k).toBe(walk.placed.length)
        // No host is reserved beyond what it can take because of the walk.
        for (const h of hosts) {
          const after = room.get(h.id) as Candidate
          if (Headroom.gatesRam(h.headroom) && after.headroom.reserved.memMib > h.headroom.reserved.memMib)
            expect(after.headroom.reserved.memMib).toBeLessThanOrEqual(h.headroom.allocatableMib as number)
          if ((after.entries ?? 0) > (h.entries ?? 0)) expect(after.entries).toBeLessThanOrEqual(limits.maxEntriesPerNode)
        }
      }),
      { numRuns: 1000 },
    )
  })

  it("property: walking on a live index leaves it holding the room left, and agrees with the walk over candidates", () => {
    fc.assert(
      fc.property(arbFleet, arbQueue, (hosts, queue) => {
        const index = PlacementIndex.Index.of(hosts)
        const onIndex = QueueWalk.walkOn(index, queue)
        const plain = QueueWalk.walk(queue, hosts)
        expect(onIndex.placed.map((p) => [p.waiting.id, p.hostId])).toStrictEqual(plain.placed.map((p) => [p.waiting.id, p.hostId]))
        const used = new Map<string, number>()
        for (const p of plain.placed) used.set(p.hostId, (used.get(p.hostId) ?? 0) + p.waiting.budget.memMib)
        for (const h of hosts) expect(index.get(h.id)?.headroom.reserved.memMib).toBe(h.headroom.reserved.memMib + (used.get(h.id) ?? 0))
      }),
      { numRuns: 500 },
    )
  })

  it("property: the cumulative park policy counts exactly the walk's unplaced sessions that are not too big for every host", () => {
    fc.assert(
      fc.property(arbFleet, arbQueue, (hosts, queue) => {
        const fleet = {
          hosts: hosts.map((h) => ({ ...h, descentsRunning: 0, parks: [] })),
          queue: queue.map((q, i) => ({ sessionId: q.id, budget: q.budget, queuedAt: i })),
        }
        const tooBig = Placement.tooBigFor(fleet.hosts)
        const expected = QueueWalk.walk(fleet.queue, fleet.hosts).unplaced.filter((q) => !tooBig(q.budget)).length
        expect(ParkPolicy.countWithoutRoomCumulative(fleet)).toBe(expected)
      }),
      { numRuns: 500 },
    )
  })

  it("a replay keeps the placements that still fit on fresh figures and says when room changed", () => {
    const plan = QueueWalk.walk([gib(2), gib(2)].map((q, i) => ({ ...q, id: `q${i}` })), [host("h1", 4096)]).placed
    expect(QueueWalk.replay(plan, [host("h1", 4096)])).toMatchObject({ diverged: false, accepted: plan })
    const shrunk = QueueWalk.replay(plan, [{ ...host("h1", 4096), headroom: { allocatableMib: 4096, cpuBudget: 64, reserved: { memMib: 1024, vcpus: 0 } } }])
    expect(shrunk.diverged).toBe(true)
    expect(shrunk.accepted.map((p) => p.waiting.id)).toStrictEqual(["q0"])
    expect(QueueWalk.replay(plan, []).accepted).toStrictEqual([])
  })

  describe("holds for starving sessions", () => {
    const LIMIT = 600_000
    const NOW = 10_000_000
    const used = (id: string, capacityGiB: number, usedGiB: number): Candidate => ({
      id,
      headroom: { allocatableMib: capacityGiB * 1024, cpuBudget: 64, reserved: { memMib: usedGiB * 1024, vcpus: 0 } },
    })
    const q = (id: string, sizeGiB: number, queuedAt: number) => ({ id, budget: { memMib: sizeGiB * 1024, vcpus: 1 }, queuedAt })
    const starvation = { now: NOW, limitMs: LIMIT }

    it("a starving session that fits nowhere gets the host with the most free RAM; a smaller later session cannot take its room", () => {
      // a: 3 GiB free, b: 2 GiB free; big (4 GiB) starves; small (3 GiB) fits only on a.
      const hosts = [used("a", 8, 5), used("b", 8, 6)]
      const queue = [q("big", 4, NOW - LIMIT), q("small", 3, NOW - 1)]
      expect(QueueWalk.claims(PlacementIndex.Index.of(hosts), queue, starvation, Limits.defaults).get("a")?.id).toBe("big")
      expect(QueueWalk.walk(queue, hosts, { starvation }).unplaced.map((w) => w.id)).toStrictEqual(["big", "small"])
      // Without the rule, or a moment before the limit, the small session takes a's hole.
      expect(QueueWalk.walk(queue, hosts).placed.map((p) => [p.waiting.id, p.hostId])).toStrictEqual([["small", "a"]])
      expect(QueueWalk.walk(queue, hosts, { starvation: { now: NOW - 1, limitMs: LIMIT } }).placed.map((p) => p.waiting.id)).toStrictEqual(["small"])
      // Other hosts still take smaller sessions.
      expect(QueueWalk.walk([...queue, q("tiny", 2, NOW)], hosts, { starvation }).placed.map((p) => [p.waiting.id, p.hostId])).toStrictEqual([["tiny", "b"]])
      // Once a has room, the holder places there first.
      const freed = QueueWalk.walk(queue, [used("a", 8, 3), used("b", 8, 6)], { starvation })
      expect(freed.placed.map((p) => [p.waiting.id, p.hostId])).toStrictEqual([["big", "a"]])
    })

    it("a create picks past a claimed host (pickUnclaimed); a starving session that fits somewhere claims nothing", () => {
      const hosts = [used("a", 8, 5), used("b", 8, 6)]
      const index = PlacementIndex.Index.of(hosts)
      const claimed = QueueWalk.claims(index, [q("big", 4, NOW - LIMIT)], starvation, Limits.defaults)
      expect([...claimed.keys()]).toStrictEqual(["a"])
      expect(QueueWalk.pickUnclaimed(index, { budget: { memMib: 3 * 1024, vcpus: 1 } }, claimed)).toBeNull()
      expect(QueueWalk.pickUnclaimed(index, { budget: { memMib: 2 * 1024, vcpus: 1 } }, claimed)).toBe("b")
      // The index is left as it was.
      expect(index.pick({ budget: { memMib: 3 * 1024, vcpus: 1 } })).toBe("a")
      expect(QueueWalk.claims(index, [q("mid", 3, NOW - LIMIT)], starvation, Limits.defaults).size).toBe(0)
    })

    it("property: the claims are those of one scan of the hosts per claim (the rule as first written), many sessions of few sizes", () => {
      // The rule as first written, the oracle: for each starving session that fits nowhere, the
      // ready, heard, measured host that could take it empty with the most free RAM (ties by id).
      const oracle = (hosts: readonly Candidate[], queue: readonly (Q & { queuedAt: number })[]) => {
        const index = PlacementIndex.Index.of(hosts)
        const out = new Map<string, string>()
        const hopeless = new Set<string>()
        for (const w of queue) {
          if (NOW - w.queuedAt < LIMIT || out.size >= QueueWalk.maxClaims) break
          const key = `${w.budget.memMib}/${w.budget.vcpus}`
          if (hopeless.has(key) || index.anyFits(w.budget, NOW)) continue
          let best: { c: Candidate; free: number } | undefined
          for (const c of index.values()) {
            if ((c.state ?? "ready") !== "ready" || Placement.isSilent(c, NOW, Limits.defaults) || !Placement.isMeasured(c) || !Placement.fitsOn(Placement.emptied(c), w.budget, { ...Limits.defaults, requireMeasured: false })) continue
            const free = Headroom.freeMib(c.headroom) ?? Number.POSITIVE_INFINITY
            if (best === undefined || free > best.free || (free === best.free && c.id < best.c.id)) best = { c, free }
          }
          if (best === undefined) {
            hopeless.add(key)
            continue
          }
          out.set(best.c.id, w.id)
          index.remove(best.c.id)
        }
        return out
      }
      const sizes = [{ memMib: 4 * 256, vcpus: 1 }, { memMib: 16 * 256, vcpus: 2 }, { memMib: 40 * 256, vcpus: 4 }, { memMib: 64 * 256, vcpus: 16 }]
      const arbStarving = fc.array(fc.record({ budget: fc.constantFrom(...sizes), late: fc.boolean() }), { maxLength: 30 }).map((qs) =>
        qs.map((q, i) => ({ id: `q${i}`, budget: q.budget, affinity: [], queuedAt: q.late && i > 20 ? NOW : NOW - LIMIT - 100 + i })),
      )
      fc.assert(
        fc.property(arbFleet, arbStarving, (hosts, queue) => {
          const index = PlacementIndex.Index.of(hosts)
          const claimed = QueueWalk.claims(index, queue, starvation, Limits.defaults)
          expect(new Map([...claimed].map(([h, w]) => [h, w.id]))).toStrictEqual(oracle(hosts, queue))
          // The index is given back whole.
          expect([...index.values()].map((c) => c.id).sort()).toStrictEqual(hosts.map((c) => c.id).sort())
        }),
        { numRuns: 500 },
      )
    })

    it("property: with the rule a later, smaller session never places on a host claimed for a session queued before it", () => {
      fc.assert(
        fc.property(arbFleet, arbQueue, (hosts, queue) => {
          const timed = queue.map((w, i) => ({ ...w, queuedAt: i < 3 ? NOW - LIMIT - 3 + i : NOW }))
          const claimed = QueueWalk.claims(PlacementIndex.Index.of(hosts), timed, starvation, Limits.defaults)
          const walk = QueueWalk.walk(timed, hosts, { starvation })
          for (const p of walk.placed) {
            const holder = claimed.get(p.hostId)
            if (holder !== undefined) expect(p.waiting.id).toBe(holder.id)
          }
        }),
      )
    })
  })
})
