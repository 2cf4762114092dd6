import { mkdtempSync, readFileSync, existsSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Downtime } from "@engram/core"
import { Effect, Fiber, Ref } from "effect"
import { TestClock } from "effect/testing"
import { ImageStore, Move, type MoveRound, RuntimeError, SimRuntime, SimWire } from "../src/index.js"

const budget = (maxDowntimeMs: number, commitAllowanceMs = 400) => ({ maxDowntimeMs, commitAllowanceMs, maxPreCopyRounds: 6 })

/** Runs `eff` to the end on the TestClock, advancing it a minute at a time. */
const onClock = <A, E>(eff: Effect.Effect<A, E>) =>
  Effect.gen(function* () {
    const fiber = yield* Effect.forkChild(eff)
    for (let i = 0; i < 30 && fiber.pollUnsafe() === undefined; i++) yield* TestClock.adjust("1 minute")
    return yield* Fiber.join(fiber)
  })

const twoHosts = (source: Partial<SimRuntime.SimConfig> = {}) =>
  Effect.gen(function* () {
    const a = yield* SimRuntime.make(source)
    const b = yield* SimRuntime.make()
    yield* onClock(a.start({ vmId: "s1", memMib: 4096, vcpus: 2 }))
    return { a, b }
  })

describe("the seed 004 hardware table on the simulated runtime", () => {
  it.effect("a 600 ms budget commits: capture ≈ 40, send ≈ 85, commit ≈ 420, within the pause", () =>
    Effect.gen(function* () {
      const { a, b } = yield* twoHosts()
      const recorded: MoveRound[] = []
      const out = yield* onClock(
        Move.between(a, b, "s1", { moveId: "m1", budget: budget(600), onRound: (r) => Effect.sync(() => void recorded.push(r)) }),
      )
      assert.strictEqual(out._tag, "Committed")
      if (out._tag !== "Committed") return
      const p = out.phases
      assert.isTrue(p.captureMs >= 36 && p.captureMs <= 43, `captureMs ${p.captureMs}`)
      assert.isTrue(p.sendMs >= 74 && p.sendMs <= 92, `sendMs ${p.sendMs}`)
      assert.isTrue(p.commitMs >= 411 && p.commitMs <= 428, `commitMs ${p.commitMs}`)
      assert.isTrue(p.downtimeMs <= 600, `downtimeMs ${p.downtimeMs}`)
      assert.isTrue(Downtime.phasesConsistent(p))
      // A full round, deltas until the dirty set stops shrinking, then the final one.
      assert.deepStrictEqual(out.rounds.map((r) => r.kind), ["full", "delta", "delta", "final"])
      assert.deepStrictEqual(recorded.map((r) => r.kind), ["full", "delta", "delta"], "every pre-copy round reported as it was measured")
      assert.deepStrictEqual((yield* b.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual(yield* a.list, [])
      assert.strictEqual(yield* Ref.get(a.pauses), 1)
    }))

  it.effect("a 480 ms budget is refused before any pause; the target keeps nothing", () =>
    Effect.gen(function* () {
      const { a, b } = yield* twoHosts()
      const out = yield* onClock(Move.between(a, b, "s1", { moveId: "m1", budget: budget(480) }))
      assert.strictEqual(out._tag, "Refused")
      if (out._tag !== "Refused") return
      assert.strictEqual(out.stage, "pre-pause")
      assert.match(out.reason, /^ErrMoveDowntime: pre-pause estimate \d+ ms > maxDowntimeMs 480 ms/)
      assert.isTrue(out.estimateMs > 480)
      assert.isNull(out.pausedMs)
      assert.strictEqual(yield* Ref.get(a.pauses), 0)
      assert.deepStrictEqual((yield* a.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.isFalse((yield* a.stats("s1")).tracking)
      assert.deepStrictEqual(yield* b.list, [])
    }))
})

describe("the post-capture check", () => {
  it.effect("a slow final capture aborts before the final round: the guest resumes on the source, the target holds nothing", () =>
    Effect.gen(function* () {
      const { a, b } = yield* twoHosts({ finalCaptureExtraMs: 300 })
      const out = yield* onClock(Move.between(a, b, "s1", { moveId: "m1", budget: budget(600) }))
      assert.strictEqual(out._tag, "Refused")
      if (out._tag !== "Refused") return
      assert.strictEqual(out.stage, "post-capture")
      assert.match(out.reason, /^ErrMoveDowntime: post-capture estimate/)
      assert.isTrue(out.estimateMs > 600)
      assert.isFalse(out.rounds.some((r) => r.kind === "final"), "no final round sent")
      assert.isTrue((out.pausedMs ?? 0) >= 300, "paused for the slow capture")
      assert.strictEqual(yield* Ref.get(a.pauses), 1)
      assert.deepStrictEqual((yield* a.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual(yield* b.list, [])
    }))

  it.effect("a budget below the commit allowance is refused before the move starts", () =>
    Effect.gen(function* () {
      const { a, b } = yield* twoHosts()
      const out = yield* onClock(Move.between(a, b, "s1", { moveId: "m1", budget: budget(300) }))
      assert.strictEqual(out._tag, "Refused")
      if (out._tag !== "Refused") return
      assert.strictEqual(out.stage, "pre-pause")
      assert.strictEqual(out.estimateMs, 400)
      assert.deepStrictEqual(out.rounds, [])
      assert.deepStrictEqual(yield* b.list, [])
    }))
})

describe("a refusal the caller overrides (overBudget: its move is committed)", () => {
  for (const c of [
    // Over budget before the pause is over it at the post-capture check too: asked at each.
    { stage: "pre-pause", source: {}, maxDowntimeMs: 480, asked: ["pre-pause", "post-capture"] },
    { stage: "post-capture", source: { finalCaptureExtraMs: 300 }, maxDowntimeMs: 600, asked: ["post-capture"] },
  ] as const)
    it.effect(`${c.stage}: the guest pauses and the final round goes; the target resumes it from the stream`, () =>
      Effect.gen(function* () {
        const { a, b } = yield* twoHosts(c.source)
        const asked: string[] = []
        const endpoint = yield* b.prepareIncoming({ vmId: "s1", memMib: 4096, vcpus: 2 }, "m1")
        const out = yield* onClock(
          a.migrate("s1", {
            moveId: "m1",
            endpoint,
            budget: budget(c.maxDowntimeMs),
            onRound: () => Effect.void,
            overBudget: (r) => Effect.sync(() => (asked.push(r.stage), true)),
          }),
        )
        assert.deepStrictEqual(asked, [...c.asked], "asked once at each refusing stage")
        assert.strictEqual(out._tag, "AtSwitchover")
        if (out._tag !== "AtSwitchover") return
        assert.isTrue(out.estimateMs > c.maxDowntimeMs, `the estimate over the budget: ${out.estimateMs}`)
        yield* onClock(out.switchover)
        const running = yield* onClock(b.commitIncoming("s1"))
        assert.strictEqual(running.status, "running")
        assert.strictEqual(yield* Ref.get(a.pauses), 1)
      }))

  it.effect("answered false, the refusal stands", () =>
    Effect.gen(function* () {
      const { a, b } = yield* twoHosts()
      const endpoint = yield* b.prepareIncoming({ vmId: "s1", memMib: 4096, vcpus: 2 }, "m1")
      const out = yield* onClock(a.migrate("s1", { moveId: "m1", endpoint, budget: budget(480), onRound: () => Effect.void, overBudget: () => Effect.succeed(false) }))
      assert.strictEqual(out._tag, "Refused")
      assert.strictEqual(yield* Ref.get(a.pauses), 0)
      assert.deepStrictEqual((yield* a.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
    }))
})

describe("a paused copy migrated (a committed move's stream sent again)", () => {
  it.effect("the pause given back leaves it paused; sent, the target resumes it from the stream", () =>
    Effect.gen(function* () {
      const { a, b } = yield* twoHosts()
      yield* a.park("s1")
      const request = (endpoint: Parameters<typeof a.migrate>[1]["endpoint"]) => ({ moveId: "m1", endpoint, budget: budget(600), onRound: () => Effect.void, overBudget: () => Effect.succeed(true) })
      const first = yield* onClock(a.migrate("s1", request(yield* b.prepareIncoming({ vmId: "s1", memMib: 4096, vcpus: 2 }, "m1"))))
      assert.strictEqual(first._tag, "AtSwitchover")
      if (first._tag !== "AtSwitchover") return
      yield* first.abort
      // Before: given back as running, a second copy beside the one the move was for.
      assert.deepStrictEqual((yield* a.list).map((v) => [v.vmId, v.status]), [["s1", "paused"]], "a copy that was paused stays paused")
      yield* onClock(b.commitIncoming("s1").pipe(Effect.ignore))
      const again = yield* onClock(a.migrate("s1", request(yield* b.prepareIncoming({ vmId: "s1", memMib: 4096, vcpus: 2 }, "m1"))))
      assert.strictEqual(again._tag, "AtSwitchover")
      if (again._tag !== "AtSwitchover") return
      yield* onClock(again.switchover)
      assert.strictEqual((yield* onClock(b.commitIncoming("s1"))).status, "running")
      assert.deepStrictEqual((yield* a.list).map((v) => [v.vmId, v.status]), [["s1", "paused"]], "the source copy kept paused until the caller destroys it")
    }))
})

describe("a move whose caller fails a round record", () => {
  it.effect("ends with the caller's error, the guest running on the source and tracking off", () =>
    Effect.gen(function* () {
      const { a, b } = yield* twoHosts()
      const endpoint = yield* b.prepareIncoming({ vmId: "s1", memMib: 4096, vcpus: 2 }, "m1")
      const failed = yield* onClock(
        a
          .migrate("s1", {
            moveId: "m1",
            endpoint,
            budget: budget(600),
            onRound: (r) => (r.kind === "delta" ? Effect.fail(new RuntimeError({ op: "record", vmId: "s1", message: "409" })) : Effect.void),
          })
          .pipe(Effect.flip),
      )
      assert.strictEqual(failed.message, "409")
      assert.deepStrictEqual((yield* a.list).map((v) => v.status), ["running"])
      assert.isFalse((yield* a.stats("s1")).tracking)
      assert.strictEqual(yield* Ref.get(a.pauses), 0)
    }))
})

describe("the target's commit", () => {
  it.effect("refuses a stream without its final round and destroys the incoming VM", () =>
    Effect.gen(function* () {
      const { b } = yield* twoHosts()
      yield* b.prepareIncoming({ vmId: "s9", memMib: 512, vcpus: 1 }, "m9")
      const e = yield* onClock(b.commitIncoming("s9").pipe(Effect.flip))
      assert.match(e.message, /not a full round/)
      assert.deepStrictEqual(yield* b.list, [])
      assert.match((yield* onClock(b.commitIncoming("s9").pipe(Effect.flip))).message, /no incoming VM/)
    }))
})

describe("park, descend and restore", () => {
  it.effect("park pauses in place and unpark resumes", () =>
    Effect.gen(function* () {
      const { a } = yield* twoHosts()
      yield* a.park("s1")
      assert.deepStrictEqual((yield* a.list).map((v) => v.status), ["paused"])
      yield* a.unpark("s1")
      assert.deepStrictEqual((yield* a.list).map((v) => v.status), ["running"])
      assert.deepStrictEqual((yield* a.usage).map((u) => u.rssBytes), [4096 * 1024 * 1024])
    }))

  // Real file I/O: on the live clock, with a fast model (a TestClock cannot wait for the disk).
  it.live("a descent writes its image file and frees the VM; the restore brings it back running", () =>
    Effect.gen(function* () {
      const a = yield* SimRuntime.make({ captureBytesPerMs: 1e12, commitMs: 1, startMs: 0 })
      yield* a.start({ vmId: "s1", memMib: 4096, vcpus: 2 })
      const store = ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-sim-images-")))
      const path = yield* store.prepare("s1")
      const image = yield* a.descend("s1", path)
      assert.strictEqual(image.path, store.pathFor("s1"))
      assert.isTrue(existsSync(image.path))
      assert.deepStrictEqual(JSON.parse(readFileSync(image.path, "utf8")), { engram: "sim-image/v1", vmId: "s1", memMib: 4096, vcpus: 2 })
      assert.deepStrictEqual(yield* a.list, [])
      // The store finds the file; how it holds the RAM is the runtime's to say.
      assert.deepStrictEqual(yield* store.get("s1"), { vmId: "s1", path: image.path, bytes: image.bytes })
      assert.strictEqual(image.method, "stream")
      const back = yield* a.restore({ vmId: "s1", memMib: 4096, vcpus: 2 }, image)
      assert.strictEqual(back.status, "running")
      assert.deepInclude(back.launch, { from: "image", method: "stream" })
      // Another VM's image is refused.
      const e = yield* a.restore({ vmId: "s2", memMib: 4096, vcpus: 2 }, image).pipe(Effect.flip)
      assert.match(e.message, /not a simulated image of s2/)
      yield* store.remove("s1")
      assert.isUndefined(yield* store.get("s1"))
    }))

  it.effect("recover re-adopts the VMs of the agent's state file", () =>
    Effect.gen(function* () {
      const fresh = yield* SimRuntime.make()
      const vms = yield* fresh.recover([{ vmId: "s1", memMib: 1024, vcpus: 1, status: "paused" }])
      assert.deepStrictEqual(vms, [{ vmId: "s1", memMib: 1024, vcpus: 1, status: "paused" }])
    }))
})

describe("the TCP wire", () => {
  it.live("carries a move between two runtimes that share nothing but the endpoint", () =>
    Effect.gen(function* () {
      const fast = { dirtyBytesPerMs: 64 * 1024, linkBytesPerMs: 1e9, captureBytesPerMs: 1e9, captureFixedMs: 1, commitMs: 1, startMs: 0 }
      const a = yield* SimRuntime.make(fast, SimWire.tcp())
      const b = yield* SimRuntime.make(fast, SimWire.tcp())
      yield* a.start({ vmId: "s1", memMib: 256, vcpus: 1 })
      const endpoint = yield* b.prepareIncoming({ vmId: "s1", memMib: 256, vcpus: 1 }, "m1")
      assert.match(endpoint.uri, /^tcp:127\.0\.0\.1:\d+$/)
      const out = yield* Move.between(a, b, "s1", { moveId: "m1", budget: budget(5000) })
      assert.strictEqual(out._tag, "Committed")
      assert.deepStrictEqual((yield* b.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual(yield* a.list, [])
      // A frame for a move the target does not hold is refused over the wire.
      const e = yield* SimWire.tcp()
        .send(endpoint.uri, { vmId: "s1", moveId: "m1", kind: "full", seq: 0, apparentBytes: 0, wireBytes: 0, memMib: 256, vcpus: 1 })
        .pipe(Effect.flip)
      assert.match(e.message, /ECONNREFUSED|refused/)
    }))
})

describe("a guest paused before its move (parked in RAM): the move pauses it no further, so no estimate refuses it", () => {
  const spec = { vmId: "s1", memMib: 4096, vcpus: 2 }
  for (const c of [
    { stage: "before the start", source: {}, maxDowntimeMs: 300, running: "pre-pause" },
    // The parked guest's rounds estimate a hair over 400 ms (an empty delta): over a 400 ms budget, not the 400 ms allowance alone.
    { stage: "pre-pause", source: {}, maxDowntimeMs: 400, running: "pre-pause" },
    { stage: "post-capture", source: { finalCaptureExtraMs: 300 }, maxDowntimeMs: 600, running: "post-capture" },
  ] as const)
    it.effect(`${c.stage} (${c.maxDowntimeMs} ms): refused for the running guest; the parked one switches over, its estimate reported, and resumes on the target`, () =>
      Effect.gen(function* () {
        // The running guest: refused at that stage.
        const ran = yield* twoHosts(c.source)
        const refused = yield* onClock(Move.between(ran.a, ran.b, "s1", { moveId: "m1", budget: budget(c.maxDowntimeMs) }))
        assert.strictEqual(refused._tag, "Refused")
        if (refused._tag === "Refused") assert.strictEqual(refused.stage, c.running)

        // The same move of the guest parked: no override asked, it switches over.
        const { a, b } = yield* twoHosts(c.source)
        yield* a.park("s1")
        const asked: string[] = []
        const endpoint = yield* b.prepareIncoming(spec, "m2")
        const out = yield* onClock(
          a.migrate("s1", { moveId: "m2", endpoint, budget: budget(c.maxDowntimeMs), onRound: () => Effect.void, overBudget: (r) => Effect.sync(() => (asked.push(r.stage), false)) }),
        )
        assert.strictEqual(out._tag, "AtSwitchover", JSON.stringify(out._tag === "AtSwitchover" ? null : out))
        if (out._tag !== "AtSwitchover") return
        assert.deepStrictEqual(asked, [], "nothing to override: the guard refused nothing")
        assert.isTrue(out.alreadyPaused)
        assert.isTrue(out.estimateMs > c.maxDowntimeMs, `the estimate is still made and reported: ${out.estimateMs}`)
        const sent = yield* onClock(out.switchover)
        assert.isNull(sent.runtimeDowntimeMs)
        assert.strictEqual((yield* onClock(b.commitIncoming("s1"))).status, "running")
        assert.strictEqual(yield* Ref.get(a.pauses), 0, "no pause of the move's own")
      }))

  it.effect("a running guest's switchover says it was not paused before", () =>
    Effect.gen(function* () {
      const { a, b } = yield* twoHosts()
      const out = yield* onClock(a.migrate("s1", { moveId: "m1", endpoint: yield* b.prepareIncoming(spec, "m1"), budget: budget(600), onRound: () => Effect.void }))
      assert.strictEqual(out._tag, "AtSwitchover")
      if (out._tag === "AtSwitchover") assert.isFalse(out.alreadyPaused)
      assert.strictEqual(yield* Ref.get(a.pauses), 1)
    }))
})
