// A guest paused before its stream began (a committed move's parked source copy, kept here until
// the commit settles) on real QEMU: a stream of it given back leaves QEMU's `postmigrate`, from
// which QEMU 7.2 refuses every later migration, a move's as much as a descent's save; and a
// stream of it runs with the guest stopped throughout, so QEMU counts every byte as downtime
// bytes. One guest, two runtimes; the tests run in order.
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, assert, beforeAll, describe, it } from "@effect/vitest"
import { cmdline, ensureGuest, readyLine } from "@engram/guest"
import { ImageStore, type MoveBudget, type VmSpec } from "@engram/runtime"
import { Effect, Exit, Scope } from "effect"
import { QemuRuntime, type QemuRuntimeShape } from "../src/index.js"
import { awaitTick, boots, consoleTicks, continuedFrom, runQemuTests } from "./support/Qemu.js"

const guest: VmSpec = { vmId: "still-1", memMib: 128, vcpus: 1 }
/** What the guest fills of its RAM at boot (non-zero data): its stream's bulk round sends at least this. */
const fillMib = 32
const MiB = 1024 * 1024
const budget: MoveBudget = { maxDowntimeMs: 60_000, commitAllowanceMs: 400, maxPreCopyRounds: 8 }

interface Host {
  readonly rt: QemuRuntimeShape
  readonly scope: Scope.Closeable
  readonly dir: string
}
const hosts: Record<"A" | "B", Host> = {} as never

const lastTick = (rt: QemuRuntimeShape) => {
  const t = consoleTicks(rt.consolePath(guest.vmId)).at(-1)
  if (t === undefined) throw new Error("no counter line yet")
  return t
}
const statusOf = (rt: QemuRuntimeShape) => rt.qmp<{ running: boolean; status: string }>(guest.vmId, "query-status")

/** Streams the paused guest from `from` to `to` and gives the stream back at pre-switchover (QEMU cancels it with the guest stopped). */
const givenBack = (from: QemuRuntimeShape, to: QemuRuntimeShape, moveId: string) =>
  Effect.gen(function* () {
    const endpoint = yield* to.prepareIncoming(guest, moveId)
    const at = yield* from.migrate(guest.vmId, { moveId, endpoint, budget, onRound: () => Effect.void, overBudget: () => Effect.succeed(true) })
    assert.strictEqual(at._tag, "AtSwitchover")
    if (at._tag === "AtSwitchover") yield* at.abort
    yield* to.destroy(guest.vmId)
    const st = yield* statusOf(from)
    console.log("paused guest after its stream was given back:", JSON.stringify(st))
    assert.isFalse(st.running, "a guest paused before its stream stays paused when it is given back")
  })

describe.skipIf(!runQemuTests)("a guest paused before its stream, on real QEMU", () => {
  beforeAll(async () => {
    const built = await ensureGuest()
    const boot = { kernel: built.kernel, initrd: built.initrd, append: cmdline({ dirtyKibPerSec: 256, hotMib: 4, fillMib }) }
    let accelerator: "auto" | "kvm" | "tcg" = "auto"
    for (const key of ["A", "B"] as const) {
      const dir = mkdtempSync(join(tmpdir(), `eq-still-${key.toLowerCase()}-`))
      const scope = Effect.runSync(Scope.make())
      const rt: QemuRuntimeShape = await Effect.runPromise(QemuRuntime.make({ stateDir: dir, boot, readyLine, accelerator }).pipe(Scope.provide(scope)))
      accelerator = rt.accel.accelerator
      hosts[key] = { rt, scope, dir }
    }
    await Effect.runPromise(hosts.A.rt.start(guest))
    await Effect.runPromise(awaitTick(hosts.A.rt.consolePath(guest.vmId), () => true, "the guest counts"))
  })

  afterAll(async () => {
    for (const h of Object.values(hosts)) {
      await Effect.runPromise(h.rt.destroy(guest.vmId).pipe(Effect.ignore))
      await Effect.runPromise(Scope.close(h.scope, Exit.void))
      rmSync(h.dir, { recursive: true, force: true })
    }
  })

  it.live("descends after a stream of it was given back (QEMU's postmigrate); the restore continues its counter", () =>
    Effect.gen(function* () {
      const { rt } = hosts.A
      yield* rt.park(guest.vmId)
      const before = lastTick(rt)
      yield* givenBack(rt, hosts.B.rt, "m-still-1")
      const images = mkdtempSync(join(tmpdir(), "eq-still-images-"))
      const store = ImageStore.directory(images)
      const image = yield* rt.descend(guest.vmId, yield* store.prepare(guest.vmId))
      console.log("descent of the given-back guest:", image.detail)
      assert.deepStrictEqual(yield* rt.list, [])
      const back = yield* rt.restore(guest, (yield* store.get(guest.vmId))!)
      assert.strictEqual(back.status, "running")
      yield* awaitTick(rt.consolePath(guest.vmId), continuedFrom(before), "counter after the restore")
      assert.strictEqual(boots(rt.consolePath(guest.vmId)), 0, "no boot since the restore: the guest continued")
      rmSync(images, { recursive: true, force: true })
    }))

  it.live("a stream of a paused guest reports its final round's bytes, not the whole stream's, and no QEMU downtime (the guest was paused already)", () =>
    Effect.gen(function* () {
      const { rt } = hosts.A
      yield* rt.park(guest.vmId)
      const before = lastTick(rt)
      const endpoint = yield* hosts.B.rt.prepareIncoming(guest, "m-still-2")
      const at = yield* rt.migrate(guest.vmId, { moveId: "m-still-2", endpoint, budget, onRound: () => Effect.void })
      assert.strictEqual(at._tag, "AtSwitchover", JSON.stringify(at))
      if (at._tag !== "AtSwitchover") return
      const sent = yield* at.switchover
      const rounds = [...at.rounds, ...at.unreported]
      console.log("paused guest streamed:", JSON.stringify({ rounds, final: at.final, sent }))
      const preCopy = rounds.reduce((n, r) => n + r.wireBytes, 0)
      assert.isAtLeast(preCopy, fillMib * MiB, "the pre-copy rounds sent the guest's RAM")
      // Nothing dirtied it since (the guest is paused): the final round sends what is left, a few pages at most.
      assert.isBelow(sent.finalWireBytes, MiB, `the final round's bytes (${sent.finalWireBytes}), not the whole stream's (${preCopy} before it)`)
      assert.isNull(sent.runtimeDowntimeMs, "no pause of the guest: it was paused before the stream")
      yield* hosts.B.rt.commitIncoming(guest.vmId)
      yield* rt.destroy(guest.vmId)
      yield* awaitTick(hosts.B.rt.consolePath(guest.vmId), continuedFrom(before), "counter on the target")
    }))

  it.live("a budget no move of the running guest fits refuses it before any stream; the parked guest is held to none (its stream pauses it no further) and continues on the target", () =>
    Effect.gen(function* () {
      const { rt } = hosts.B
      const tiny: MoveBudget = { maxDowntimeMs: 1, commitAllowanceMs: 400, maxPreCopyRounds: 8 }
      const running = yield* rt.migrate(guest.vmId, { moveId: "m-still-3", endpoint: yield* hosts.A.rt.prepareIncoming(guest, "m-still-3"), budget: tiny, onRound: () => Effect.void })
      assert.strictEqual(running._tag, "Refused")
      yield* hosts.A.rt.destroy(guest.vmId)
      yield* rt.park(guest.vmId)
      const before = lastTick(rt)
      const endpoint = yield* hosts.A.rt.prepareIncoming(guest, "m-still-4")
      const at = yield* rt.migrate(guest.vmId, { moveId: "m-still-4", endpoint, budget: tiny, onRound: () => Effect.void })
      assert.strictEqual(at._tag, "AtSwitchover", JSON.stringify(at))
      if (at._tag !== "AtSwitchover") return
      assert.isTrue(at.alreadyPaused)
      assert.isAbove(at.estimateMs, tiny.maxDowntimeMs, "the estimate is made and reported all the same")
      const sent = yield* at.switchover
      assert.isNull(sent.runtimeDowntimeMs)
      yield* hosts.A.rt.commitIncoming(guest.vmId)
      yield* rt.destroy(guest.vmId)
      yield* awaitTick(hosts.A.rt.consolePath(guest.vmId), continuedFrom(before), "counter on the target")
    }))
})
