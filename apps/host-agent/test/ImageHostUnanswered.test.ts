/**
 * A resumed session placed on host a while its descent image sits on host b, whose agent does not
 * answer (frozen or cut off: the fetch's probe times out), answers 503, refuses the connection or
 * is at a peer URL not known yet. Before, any failed fetch booted a fresh guest at once: the
 * user's memory was lost although the image was intact on b (and, with image removal on, b then
 * removed it as released). Now only the image host's word that it has no such image boots fresh
 * at once; any other failure fails the session's action, which the retry pass tries again
 * (backing off) while the session stays pending, until `imageFetchDeadlineMs` has passed since
 * the first try: then the agent gives up, boots fresh, warns and tells the coordinator
 * (`guest-lost`) that the memory is lost. The image host's own 404 (or, resumed on the image
 * host itself, no image in its store) is a loss too, told at once: a descent that left no image
 * names no image host (its loss told at the descent), so this is not the same loss told twice.
 *
 * Clock-driven: the image host's answers are scripted here (each the message `ImageFetch` gives
 * for it over real HTTP, pinned in `ImageFetch.test.ts`), and the runtime's restore starts the
 * VM without reading a file, so every step is one the TestClock tracks.
 */
import { assert, describe } from "@effect/vitest"
import { type DescentImage, type ImageStore, SimRuntime, type VmRuntimeShape } from "@engram/runtime"
import { Clock, Effect, Random, Ref } from "effect"
import { type AgentConfig, defaultImageFetchDeadlineMs, imageAbsentReasonOf, imageHostRemovedReasonOf, imageLostReasonOf, makeAgent } from "../src/Agent.js"
import { defaultAgentConfig } from "../src/Host.js"
import * as ImageFetch from "../src/ImageFetch.js"
import { makeMoveTarget } from "../src/MoveTarget.js"
import * as PeerLink from "../src/PeerLink.js"
import { makeResidents } from "../src/Residents.js"
import { makeFakeCoordinator } from "./support/FakeCoordinator.js"
import { capture } from "./support/Logs.js"
import { effect, fixedRandom, stepUntil } from "./support/PatientClock.js"

/** How the image host answers a fetch: a failure's message (`absent`: its own 404), or the image. */
type Answer = { readonly fails: string; readonly absent?: boolean; readonly afterMs?: number } | "image"

const hung = { fails: `the image host's peer server did not answer a probe within ${ImageFetch.imageHostProbeMs} ms (frozen, or cut off?)`, afterMs: ImageFetch.imageHostProbeMs }
const unavailable = { fails: "the image host answered 503 to the listing" }
const refused = { fails: "fetch failed" }
const unknownUrl = { fails: "no peer URL is known for the image host" }
const noSuchImage = { fails: "the image host has no descent image of session s1", absent: true }

const pendingLine = "descent image could not be fetched from the host holding it; the session stays pending and the fetch is tried again"
const gaveUpLine = "descent image could not be fetched from the host holding it within ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS; giving up: booting a fresh guest, the session's memory is lost (the coordinator is told)"
const missingLine = "resumed session's descent image is not on this host; booting a fresh guest in its place: its memory is not restored"
const removedLine = "the host holding the session's descent image was removed from the fleet; booting a fresh guest, the session's memory is lost (the coordinator is told)"
/** What the coordinator says of b once it is removed from the fleet. */
const bRemoved = [{ hostId: "b", peerUrl: null, removed: true }]

const absentLine = "descent image could not be fetched from the host holding it: it has no such image; booting a fresh guest, the session's memory is lost (the coordinator is told)"

/**
 * Host a's agent with s1 resumed there (pending, ran before) and its image on b, which answers
 * each fetch with the next of `answers` (the last one again once they run out). Counts the
 * runtime's boots and restores; an image fetched lands in an in-memory image store.
 */
const resumedAwayFromImage = (answers: readonly Answer[], config: Partial<AgentConfig> = {}, imageHostId: string | null = "b") =>
  Effect.gen(function* () {
    const fake = yield* makeFakeCoordinator
    yield* fake.addSession("s1", "a", 1024, 1)
    yield* Ref.update(fake.ref, (s) => ({ ...s, sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, createdAt: 1_000, lastActiveAt: 2_000, imageHostId }) }))
    const sim = yield* SimRuntime.make({ startMs: 50 })
    const counts = { starts: 0, restores: 0, fetches: 0 }
    const runtime: VmRuntimeShape = {
      ...sim,
      start: (spec, options) => Effect.andThen(Effect.sync(() => counts.starts++), sim.start(spec, options)),
      // The VM from the image, without reading a file (a sim restore reads one).
      restore: (spec) => Effect.andThen(Effect.sync(() => counts.restores++), sim.start(spec)),
    }
    const held = new Set<string>()
    const images: ImageStore.ImageStore = {
      root: "/images",
      pathFor: (vmId) => `/images/${vmId}/image`,
      prepare: (vmId) => Effect.succeed(`/images/${vmId}/image`),
      get: (vmId) => Effect.sync((): DescentImage | undefined => (held.has(vmId) ? { vmId, path: `/images/${vmId}/image`, bytes: 4096 } : undefined)),
      remove: (vmId) => Effect.sync(() => void held.delete(vmId)),
    }
    const fetchImage = (sessionId: string, imageHostId: string) =>
      Effect.gen(function* () {
        const answer = answers[Math.min(counts.fetches, answers.length - 1)]!
        counts.fetches++
        if (answer === "image") {
          held.add(sessionId)
          return { files: 1, bytes: 4096 }
        }
        if (answer.afterMs !== undefined) yield* Effect.sleep(answer.afterMs)
        return yield* new ImageFetch.ImageFetchError({ sessionId, imageHostId, message: answer.fails, ...(answer.absent === true ? { absent: true } : {}) })
      })
    const residents = yield* makeResidents("a", null, () => Effect.void)
    const agent = yield* makeAgent(
      { ...defaultAgentConfig("a"), ...config },
      {
        coordinator: fake.client("a"),
        runtime,
        measure: () => Effect.succeed({ totalMib: 16384, allocatableMib: 15360, totalVcpus: 8 }),
        residents,
        images,
        link: PeerLink.inMemory(new Map()),
        target: yield* makeMoveTarget("a", runtime, residents),
        fetchImage,
      },
    )
    return { fake, agent, counts }
  }).pipe(Effect.provideService(Random.Random, fixedRandom(0.5)))

const stateOf = (fake: Effect.Success<typeof makeFakeCoordinator>) => Effect.map(fake.get, (s) => s.sessions.get("s1")!.state)

describe("a resumed session whose image host does not answer", () => {
  effect("a hung image host, a 503, a refused connection, an unknown peer URL: the session is not booted fresh, stays pending, and is restored once the host answers", () => {
    const warnings = capture("Warn")
    return Effect.gen(function* () {
      const { fake, agent, counts } = yield* resumedAwayFromImage([hung, unavailable, refused, unknownUrl, "image"])
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      // Each failure fails the action; the retry pass reads the assignments again and tries again.
      yield* stepUntil("the session restored", () => Effect.map(stateOf(fake), (s) => s === "running"))
      yield* stepUntil("the pass's actions done", () => Effect.map(agent.busy, (b) => !b))
      assert.deepStrictEqual(counts, { starts: 0, restores: 1, fetches: 5 })
      const pending = warnings.lines.filter((l) => l.message === pendingLine)
      assert.deepStrictEqual(pending.map((l) => l.fields["why"]), [hung.fails, unavailable.fails, refused.fails, unknownUrl.fails])
      assert.isTrue(pending.every((l) => l.fields["imageHostId"] === "b" && l.fields["deadlineMs"] === defaultImageFetchDeadlineMs))
      assert.deepStrictEqual(warnings.lines.filter((l) => l.message === gaveUpLine), [])
      assert.deepStrictEqual((yield* fake.get).guestsLost, [])
    }).pipe(Effect.provide(warnings.layer))
  })

  effect("while the image host does not answer, no guest boots and nothing is told: the session waits pending, its fetch tried again, backing off", () =>
    Effect.gen(function* () {
      const { fake, agent, counts } = yield* resumedAwayFromImage([unavailable])
      const t0 = yield* Clock.currentTimeMillis
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* stepUntil("five tries", () => Effect.succeed(counts.fetches >= 5))
      assert.isBelow((yield* Clock.currentTimeMillis) - t0, defaultImageFetchDeadlineMs)
      assert.strictEqual(yield* stateOf(fake), "pending")
      assert.deepStrictEqual([counts.starts, counts.restores], [0, 0])
      assert.deepStrictEqual((yield* fake.get).guestsLost, [])
    }),
  )

  effect("the image host's own word that it has no such image (its listing's 404): a fresh guest boots at once, and the coordinator is told the memory is lost, once", () => {
    const warnings = capture("Warn")
    return Effect.gen(function* () {
      const { fake, agent, counts } = yield* resumedAwayFromImage([noSuchImage])
      const t0 = yield* Clock.currentTimeMillis
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* stepUntil("the session running", () => Effect.map(stateOf(fake), (s) => s === "running"))
      yield* stepUntil("the loss told", () => Effect.map(fake.get, (s) => s.guestsLost.length > 0))
      yield* stepUntil("the pass's actions done", () => Effect.map(agent.busy, (b) => !b))
      // At once: not after the fetch deadline.
      assert.isBelow((yield* Clock.currentTimeMillis) - t0, defaultImageFetchDeadlineMs / 10)
      assert.deepStrictEqual(counts, { starts: 1, restores: 0, fetches: 1 })
      assert.deepStrictEqual(warnings.lines.filter((l) => l.message === absentLine).map((l) => [l.fields["imageHostId"], l.fields["why"]]), [["b", noSuchImage.fails]])
      assert.deepStrictEqual((yield* fake.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: imageAbsentReasonOf("b", noSuchImage.fails) }])
      assert.deepStrictEqual(warnings.lines.filter((l) => l.message === pendingLine || l.message === gaveUpLine), [])
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* stepUntil("the pass's actions done", () => Effect.map(agent.busy, (b) => !b))
      assert.strictEqual((yield* fake.get).guestsLost.length, 1)
      assert.strictEqual(counts.fetches, 1)
    }).pipe(Effect.provide(warnings.layer))
  })

  effect("resumed on the host the coordinator names as holding its image, with no image there (its directory wiped): a fresh guest, and the loss told", () =>
    Effect.gen(function* () {
      const { fake, agent, counts } = yield* resumedAwayFromImage([unavailable], {}, "a")
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* stepUntil("the session running", () => Effect.map(stateOf(fake), (s) => s === "running"))
      yield* stepUntil("the loss told", () => Effect.map(fake.get, (s) => s.guestsLost.length > 0))
      assert.deepStrictEqual(counts, { starts: 1, restores: 0, fetches: 0 })
      assert.deepStrictEqual((yield* fake.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: imageAbsentReasonOf("a", "not in this host's image store") }])
    }),
  )

  effect("a session whose descent left no image (the coordinator names no image host; its loss was told at the descent): a fresh guest at once, nothing fetched, nothing told again", () => {
    const errors = capture("Error")
    return Effect.gen(function* () {
      const { fake, agent, counts } = yield* resumedAwayFromImage([unavailable], {}, null)
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* stepUntil("the session running", () => Effect.map(stateOf(fake), (s) => s === "running"))
      yield* stepUntil("the pass's actions done", () => Effect.map(agent.busy, (b) => !b))
      assert.deepStrictEqual(counts, { starts: 1, restores: 0, fetches: 0 })
      assert.deepStrictEqual(errors.lines.filter((l) => l.message === missingLine).map((l) => l.fields["sessionId"]), ["s1"])
      assert.deepStrictEqual((yield* fake.get).guestsLost, [])
    }).pipe(Effect.provide(errors.layer))
  })

  effect("past ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS the agent gives up: a fresh guest, a warning, and the coordinator told the memory is lost", () => {
    const warnings = capture("Warn")
    return Effect.gen(function* () {
      const deadlineMs = 60_000
      const { fake, agent, counts } = yield* resumedAwayFromImage([unavailable], { imageFetchDeadlineMs: deadlineMs })
      const t0 = yield* Clock.currentTimeMillis
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* stepUntil("the session running", () => Effect.map(stateOf(fake), (s) => s === "running"))
      yield* stepUntil("the pass's actions done", () => Effect.map(agent.busy, (b) => !b))
      assert.isAtLeast((yield* Clock.currentTimeMillis) - t0, deadlineMs)
      assert.deepStrictEqual([counts.starts, counts.restores], [1, 0])
      const gaveUp = warnings.lines.filter((l) => l.message === gaveUpLine)
      assert.strictEqual(gaveUp.length, 1)
      assert.deepStrictEqual([gaveUp[0]!.fields["imageHostId"], gaveUp[0]!.fields["why"], gaveUp[0]!.fields["deadlineMs"]], ["b", unavailable.fails, deadlineMs])
      assert.isAtLeast(gaveUp[0]!.fields["failingMs"] as number, deadlineMs)
      assert.deepStrictEqual((yield* fake.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: imageLostReasonOf("b", deadlineMs, unavailable.fails) }])
      // Given up: no fetch is tried again, and the loss is told once.
      const fetches = counts.fetches
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* stepUntil("the pass's actions done", () => Effect.map(agent.busy, (b) => !b))
      assert.strictEqual(counts.fetches, fetches)
      assert.strictEqual((yield* fake.get).guestsLost.length, 1)
    }).pipe(Effect.provide(warnings.layer))
  })

  effect("the image host removed from the fleet (the coordinator says so): a fresh guest at once, no fetch tried, the loss told with its reason", () => {
    const warnings = capture("Warn")
    return Effect.gen(function* () {
      const { fake, agent, counts } = yield* resumedAwayFromImage([unavailable])
      yield* Ref.update(fake.ref, (s) => ({ ...s, imageHosts: bRemoved }))
      const t0 = yield* Clock.currentTimeMillis
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* stepUntil("the session running", () => Effect.map(stateOf(fake), (s) => s === "running"))
      yield* stepUntil("the loss told", () => Effect.map(fake.get, (s) => s.guestsLost.length > 0))
      // Promptly: not after the fetch deadline (10 minutes), nor after a retry's backoff.
      assert.isBelow((yield* Clock.currentTimeMillis) - t0, defaultImageFetchDeadlineMs / 10)
      assert.deepStrictEqual(counts, { starts: 1, restores: 0, fetches: 0 })
      assert.deepStrictEqual((yield* fake.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: imageHostRemovedReasonOf("b") }])
      assert.deepStrictEqual(warnings.lines.filter((l) => l.message === removedLine).map((l) => [l.fields["sessionId"], l.fields["imageHostId"]]), [["s1", "b"]])
      assert.deepStrictEqual(warnings.lines.filter((l) => l.message === pendingLine || l.message === gaveUpLine), [])
    }).pipe(Effect.provide(warnings.layer))
  })

  effect("the image host removed while its fetch fails: the next try boots fresh, well before the deadline, and tells the loss once", () =>
    Effect.gen(function* () {
      const { fake, agent, counts } = yield* resumedAwayFromImage([unavailable])
      const t0 = yield* Clock.currentTimeMillis
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* stepUntil("two tries", () => Effect.succeed(counts.fetches >= 2))
      assert.strictEqual(yield* stateOf(fake), "pending")
      // The coordinator now says b is gone (its long-poll answers it): the retry pass reads it.
      yield* Ref.update(fake.ref, (s) => ({ ...s, imageHosts: bRemoved }))
      const fetches = counts.fetches
      yield* stepUntil("the session running", () => Effect.map(stateOf(fake), (s) => s === "running"))
      yield* stepUntil("the loss told", () => Effect.map(fake.get, (s) => s.guestsLost.length > 0))
      yield* stepUntil("the pass's actions done", () => Effect.map(agent.busy, (b) => !b))
      assert.isBelow((yield* Clock.currentTimeMillis) - t0, defaultImageFetchDeadlineMs / 2)
      assert.deepStrictEqual([counts.starts, counts.restores, counts.fetches], [1, 0, fetches])
      assert.deepStrictEqual((yield* fake.get).guestsLost, [{ hostId: "a", sessionId: "s1", reason: imageHostRemovedReasonOf("b") }])
      yield* agent.reconcile(yield* fake.assignmentsOf("a"))
      yield* stepUntil("the pass's actions done", () => Effect.map(agent.busy, (b) => !b))
      assert.strictEqual((yield* fake.get).guestsLost.length, 1)
    }),
  )
})
