/**
 * A resume beside an image without a descent tag (an older agent's, or one whose tag a descent
 * cleared before a capture that failed) of a session that ran again since, elsewhere.
 *
 * s1 descends on a (its image left there without a tag), resumes on b (fetched from a), runs,
 * descends on b: the coordinator names b as holding its image. Its next resume is placed on a.
 * Before, a took its own tag-less image for the session's (a tag-less image was judged only by
 * whether the session ever ran) and restored it instead of fetching b's: the guest silently went
 * back to its state before it ran on b. Now a tag-less image is of the session's last descent only
 * when the coordinator names no host as holding that descent's image, or names the host it is on
 * (the one fetched from, for a fetched image): otherwise the image the coordinator names is
 * fetched, and when it cannot be had the guest boots fresh and the loss is told, never the older
 * image restored.
 */
import { rmSync } from "node:fs"
import { dirname, join } from "node:path"
import { assert, describe } from "@effect/vitest"
import { Effect, Ref } from "effect"
import { imageAbsentReasonOf } from "../src/Agent.js"
import { makeFleet, type TestHost } from "./support/InProcess.js"
import { effect } from "./support/PatientClock.js"

type Fleet = Effect.Success<ReturnType<typeof makeFleet>>

const session = (f: Fleet) => Effect.map(f.coordinator.get, (s) => s.sessions.get("s1")!)
const boots = (h: TestHost) => Ref.get(h.runtime.starts)

/** How a's image loses its tag: never written (an older agent's), or cleared (a descent began and its capture failed). */
type Untagged = "no tag" | "cleared tag"
const untag = (h: TestHost, how: Untagged) =>
  how === "no tag" ? Effect.sync(() => rmSync(join(dirname(h.images.pathFor("s1")), "descent.json"), { force: true })) : Effect.orDie(h.images.writeTag!("s1", null))

/** Resumes s1 on `h` and answers how its guest came to run there: booted fresh, or restored from an image. */
const resumeOn = (f: Fleet, h: TestHost) =>
  Effect.gen(function* () {
    const before = yield* boots(h)
    yield* f.coordinator.place("s1", h.hostId, "pending")
    yield* f.settle()
    assert.strictEqual((yield* session(f)).state, "running")
    return (yield* boots(h)) > before ? "boot" : "image"
  })

/** s1 descended on a (its image left there untagged), then ran on b and descended there: the coordinator names b. */
const ranElsewhereSince = (how: Untagged) =>
  Effect.gen(function* () {
    const f = yield* makeFleet([{ hostId: "a" }, { hostId: "b" }], { fetchImages: true })
    const [a, b] = [f.hosts[0]!, f.hosts[1]!]
    yield* f.coordinator.addSession("s1", "a", 1024, 1)
    yield* Ref.update(f.coordinator.ref, (s) => ({ ...s, sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, createdAt: 1_000, lastActiveAt: 1_000 }) }))
    yield* f.settle()
    yield* f.coordinator.setState("s1", "descending")
    yield* f.settle()
    assert.strictEqual((yield* session(f)).imageHostId, "a")
    yield* untag(a, how)
    // Resumed on b: fetched from a (the image the coordinator names) and restored.
    assert.strictEqual(yield* resumeOn(f, b), "image")
    yield* f.coordinator.setState("s1", "descending")
    yield* f.settle()
    assert.strictEqual((yield* session(f)).imageHostId, "b", "the last descent's image is on b")
    assert.isDefined(yield* a.images.get("s1"), "a still holds its older, untagged image")
    yield* Ref.set(f.fetches, [])
    return { f, a, b }
  })

describe("a resume beside a tag-less image of a session that ran elsewhere since", () => {
  for (const how of ["no tag", "cleared tag"] as const) {
    effect(`${how}: the image the coordinator names is fetched and restored, not the older one here`, () =>
      Effect.gen(function* () {
        const { f, a } = yield* ranElsewhereSince(how)
        assert.strictEqual(yield* resumeOn(f, a), "image")
        assert.deepStrictEqual(yield* Ref.get(f.fetches), ["a <- b: s1"], "fetched from b, which holds the last descent's image")
        assert.deepStrictEqual((yield* f.coordinator.get).guestsLost, [])
      }),
    )
  }

  effect("the named host has no such image: the guest boots fresh and the loss is told, the older image here not restored", () =>
    Effect.gen(function* () {
      const { f, a, b } = yield* ranElsewhereSince("no tag")
      yield* b.images.remove("s1")
      assert.strictEqual(yield* resumeOn(f, a), "boot")
      assert.deepStrictEqual(yield* Ref.get(f.fetches), ["a <- b: s1"])
      const lost = (yield* f.coordinator.get).guestsLost
      assert.deepStrictEqual(
        lost.map((l) => l.sessionId),
        ["s1"],
      )
      assert.include(lost[0]!.reason, imageAbsentReasonOf("b", "").split("(")[0]!)
    }),
  )

  effect("a tag-less image on the host the coordinator names is restored (an older agent's descent here)", () =>
    Effect.gen(function* () {
      const f = yield* makeFleet([{ hostId: "a" }, { hostId: "b" }], { fetchImages: true })
      const a = f.hosts[0]!
      yield* f.coordinator.addSession("s1", "a", 1024, 1)
      yield* Ref.update(f.coordinator.ref, (s) => ({ ...s, sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, createdAt: 1_000, lastActiveAt: 1_000 }) }))
      yield* f.settle()
      yield* f.coordinator.setState("s1", "descending")
      yield* f.settle()
      yield* untag(a, "no tag")
      assert.strictEqual(yield* resumeOn(f, a), "image")
      assert.deepStrictEqual(yield* Ref.get(f.fetches), [])
      assert.deepStrictEqual((yield* f.coordinator.get).guestsLost, [])
    }),
  )
})
