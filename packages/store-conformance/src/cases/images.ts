/**
 * Descent images (SPEC §12, §2): a descended session remembers the host whose agent holds its
 * image (`imageHostId`) until it runs again or ends; its cold resume, and a queue drain of it,
 * rank that host first among the hosts that fit, over a better fit and over its affinity. A
 * ranking signal, never a fit rule: without room there, the session goes elsewhere. The image
 * host's assignments list the session (`imageSessionIds`) until it runs again or ends.
 */
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { addHost, expectInvariants, kase, parkedNow, placed, reportAll, store } from "../Harness.js"
import type { Group } from "../Harness.js"

const gib = (n: number) => ({ memMib: n * 1024, vcpus: 1 })

/** Creates `id` (1 GiB) on the only host that has room, runs it, parks it and descends it there. */
const descendedOn = (id: string, affinity?: readonly string[]) =>
  Effect.gen(function* () {
    const s = yield* store
    yield* placed(id, gib(1), affinity)
    yield* s.markRunning(id)
    yield* parkedNow(id)
    yield* s.beginDescent(id)
    return yield* s.finishDescent(id)
  })

export const images: Group = {
  name: "images",
  cases: [
    kase(
      "a descended session names the host holding its image until it runs again; an ended one names none",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h", 8192)
        expect((yield* placed("s1", gib(1))).imageHostId).toBeNull()
        const d = yield* descendedOn("s2")
        expect(d).toMatchObject({ state: "descended", hostId: null, imageHostId: "h" })
        expect((yield* s.getSession("s2")).imageHostId).toBe("h")
        expect((yield* s.listSessions()).find((x) => x.id === "s2")?.imageHostId).toBe("h")
        expect((yield* s.hostAssignments("h")).imageSessionIds).toStrictEqual(["s2"])
        expect((yield* s.listSessions({ imageHostId: "h" })).map((x) => x.id)).toStrictEqual(["s2"])
        expect(yield* s.listSessions({ imageHostId: "other" })).toStrictEqual([])
        const back = yield* s.resume("s2")
        expect(back.session).toMatchObject({ state: "pending", hostId: "h", imageHostId: "h" })
        expect((yield* s.listSessions({ state: "pending", imageHostId: "h" })).map((x) => x.id)).toStrictEqual(["s2"])
        expect(yield* s.markRunning("s2")).toMatchObject({ state: "running", imageHostId: null })
        yield* descendedOn("s3")
        expect((yield* s.hostAssignments("h")).imageSessionIds).toStrictEqual(["s3"])
        const ended = yield* s.endSession("s3")
        expect(ended.session).toMatchObject({ state: "ended", imageHostId: null })
        // The host that held the image is named by the end's answer (it is owed a notice).
        expect(ended.before).toMatchObject({ state: "descended", imageHostId: "h" })
        expect((yield* s.hostAssignments("h")).imageSessionIds).toStrictEqual([])
      }),
    ),
    kase(
      "a descent that left no image (imageless) names no image host, its image host lists nothing, and its resume is placed as a new session",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h", 8192)
        yield* placed("s1", gib(1))
        yield* s.markRunning("s1")
        yield* parkedNow("s1")
        yield* s.beginDescent("s1")
        const d = yield* s.finishDescent("s1", { imageless: true })
        expect(d).toMatchObject({ state: "descended", hostId: null, reservationId: null, imageHostId: null })
        expect((yield* s.getSession("s1")).imageHostId).toBeNull()
        expect((yield* s.hostAssignments("h")).imageSessionIds).toStrictEqual([])
        expect(yield* s.listSessions({ imageHostId: "h" })).toStrictEqual([])
        expect((yield* s.sessionEvents("s1")).items.at(-1)).toMatchObject({ event: { _tag: "Descended", hostId: "h" } })
        const back = yield* s.resume("s1")
        expect(back.session).toMatchObject({ state: "pending", hostId: "h", imageHostId: null })
        // Said false, or not said: the host it descended on holds the image (as before).
        yield* descendedOn("s2")
        yield* s.resume("s2")
        yield* s.markRunning("s2")
        yield* parkedNow("s2")
        yield* s.beginDescent("s2")
        expect((yield* s.finishDescent("s2", { imageless: false })).imageHostId).toBe("h")
        yield* expectInvariants
      }),
    ),
    kase(
      "a host holding descent images, and nothing else, can be removed: its sessions still name it (the coordinator says it is gone)",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h", 8192)
        yield* descendedOn("s1")
        yield* addHost("b", 8192)
        yield* s.removeHost("h")
        expect((yield* s.getSession("s1")).imageHostId).toBe("h")
        const back = yield* s.resume("s1")
        expect(back.session).toMatchObject({ state: "pending", hostId: "b", imageHostId: "h" })
        expect((yield* s.listSessions({ state: "pending", imageHostId: "h" })).map((x) => x.id)).toStrictEqual(["s1"])
        yield* expectInvariants
      }),
    ),
    kase(
      "a cold resume is placed on the image's host while it has room, over a better fit and over the session's affinity",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h", 16384)
        // Created when only h could take it; its affinity names b, which comes later.
        yield* descendedOn("s1", ["b"])
        yield* descendedOn("s2")
        yield* addHost("b", 4096)
        yield* addHost("c", 2048)
        const one = yield* s.resume("s1")
        expect(one.session.hostId, "resumed away from the host holding its image").toBe("h")
        const two = yield* s.resume("s2")
        expect(two.session.hostId, "resumed away from the host holding its image").toBe("h")
        yield* expectInvariants
      }),
    ),
    kase(
      "concurrent cold resumes each go to their own image's host",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 16384)
        yield* descendedOn("a")
        yield* s.setHostState("h1", "cordoned")
        yield* addHost("h2", 16384)
        yield* descendedOn("b")
        yield* s.setHostState("h1", "ready")
        yield* addHost("fit", 4096)
        const out = yield* Effect.all([s.resume("a"), s.resume("b")], { concurrency: "unbounded" })
        expect(out.map((o) => o.session.hostId)).toStrictEqual(["h1", "h2"])
        yield* expectInvariants
      }),
    ),
    kase(
      "without room on the image's host a cold resume goes to the best fit elsewhere",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h", 8192)
        yield* descendedOn("s1")
        yield* placed("fill", gib(8))
        yield* addHost("b", 4096)
        yield* addHost("c", 2048)
        const back = yield* s.resume("s1")
        expect(back._tag).toBe("Placed")
        expect(back.session).toMatchObject({ hostId: "c", imageHostId: "h" })
        // The image stays listed as h's until the session runs on c (c's agent fetches it from h meanwhile).
        expect((yield* s.hostAssignments("h")).imageSessionIds).toStrictEqual(["s1"])
        expect((yield* s.hostAssignments("c")).imageSessionIds).toStrictEqual([])
        yield* s.markRunning("s1")
        expect((yield* s.hostAssignments("h")).imageSessionIds).toStrictEqual([])
        yield* expectInvariants
      }),
    ),
    kase(
      "a restore cut short by a reclaim (the restoring host went silent) names the image's host in the reclaim's answer; its image is no longer listed",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h", 8192)
        yield* descendedOn("s1")
        yield* placed("fill", gib(8))
        yield* addHost("c", 2048)
        const back = yield* s.resume("s1")
        expect(back.session).toMatchObject({ state: "pending", hostId: "c", imageHostId: "h" })
        yield* TestClock.adjust(2 * 60 * 1000 + 1)
        yield* s.heartbeat((yield* s.getSession("fill")).reservationId as string)
        yield* reportAll
        const result = yield* s.reclaim()
        expect(result.lostSessions).toStrictEqual(["s1"])
        expect(result.imageHostIds).toStrictEqual(["h"])
        expect(result.closedMoves).toStrictEqual([])
        expect((yield* s.hostAssignments("h")).imageSessionIds).toStrictEqual([])
        yield* expectInvariants
      }),
    ),
    kase(
      "a queued cold resume keeps its image's host and is drained to it over a better fit",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h", 8192)
        yield* descendedOn("s1")
        yield* placed("fill", gib(8))
        const q = yield* s.resume("s1")
        expect(q._tag).toBe("Queued")
        expect(q.session).toMatchObject({ state: "queued", imageHostId: "h" })
        yield* s.endSession("fill")
        yield* addHost("b", 4096)
        const drained = yield* s.drainQueue()
        expect(drained.placed).toStrictEqual([{ sessionId: "s1", hostId: "h" }])
        yield* expectInvariants
      }),
    ),
  ],
}
