// The QEMU runtime on real guests under TCG (KVM where /dev/kvm works): park, descend and
// restore, live moves (committed, refused before the pause, given back at pre-switchover) and
// recovery after an agent restart. The tests run in order and share three runtimes ("hosts"):
// A and B (1 GiB/s moves) and C (16 MiB/s, for a guest that dirties faster than its link).
import { existsSync, mkdtempSync, readdirSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, assert, beforeAll, describe, it } from "@effect/vitest"
import { Downtime } from "@engram/core"
import { cmdline, ensureGuest } from "@engram/guest"
import { ImageStore, Move, type MoveRound, type VmSpec } from "@engram/runtime"
import { Effect, Exit, Scope } from "effect"
import { QemuProcess, QemuRuntime, type QemuRuntimeShape } from "../src/index.js"
import { awaitTick, boots, consoleTicks, continuedFrom, runQemuTests } from "./support/Qemu.js"

const calm: VmSpec = { vmId: "calm-1", memMib: 128, vcpus: 1 }
const hot: VmSpec = { vmId: "hot-1", memMib: 128, vcpus: 1 }

interface Host {
  rt: QemuRuntimeShape
  scope: Scope.Closeable
  readonly stateDir: string
  readonly bandwidth: number
}
const hosts: Record<"A" | "B" | "C", Host> = {} as never
let boot: QemuRuntime.QemuConfig["boot"]

const openHost = async (stateDir: string, bandwidth: number): Promise<Host> => {
  const scope = Effect.runSync(Scope.make())
  const rt = await Effect.runPromise(QemuRuntime.make({ stateDir, boot, moveBandwidthBytesPerSec: bandwidth }).pipe(Scope.provide(scope)))
  return { rt, scope, stateDir, bandwidth }
}
const lastTick = (rt: QemuRuntimeShape, vmId: string) => {
  const t = consoleTicks(rt.consolePath(vmId)).at(-1)
  if (t === undefined) throw new Error(`no counter line from ${vmId} yet`)
  return t
}
const statusOf = (rt: QemuRuntimeShape, vmId: string) => rt.qmp<{ running: boolean; status: string }>(vmId, "query-status")

describe.skipIf(!runQemuTests)("the QEMU runtime on real guests (needs qemu-system-x86_64: CI installs it; skipped elsewhere without it)", () => {
  beforeAll(async () => {
    const guest = await ensureGuest()
    boot = (spec) => ({
      kernel: guest.kernel,
      initrd: guest.initrd,
      append: cmdline(spec.vmId.startsWith("hot") ? { dirtyKibPerSec: 64 * 1024, hotMib: 32 } : { dirtyKibPerSec: 256, hotMib: 4 }),
    })
    hosts.A = await openHost(mkdtempSync(join(tmpdir(), "eq-a-")), 1024 ** 3)
    hosts.B = await openHost(mkdtempSync(join(tmpdir(), "eq-b-")), 1024 ** 3)
    hosts.C = await openHost(mkdtempSync(join(tmpdir(), "eq-c-")), 16 * 1024 ** 2)
    // The calm guest serves every test but one; the hot one (a core's worth of dirtying) lives only in its test.
    await Effect.runPromise(hosts.A.rt.start(calm).pipe(Effect.andThen(awaitTick(hosts.A.rt.consolePath(calm.vmId), (t) => t.n >= 2, "calm guest boots"))))
  })

  afterAll(async () => {
    for (const h of Object.values(hosts)) {
      if (h === undefined) continue
      await Effect.runPromise(Effect.forEach([calm.vmId, hot.vmId], (id) => h.rt.destroy(id), { discard: true }))
      await Effect.runPromise(Scope.close(h.scope, Exit.void))
    }
  })

  it.live("reports the accelerator it probed, and why", () =>
    Effect.gen(function* () {
      const info = yield* hosts.A.rt.info
      assert.strictEqual(info.kind, "qemu")
      assert.include(["kvm", "tcg"], info.accelerator)
      if (!existsSync("/dev/kvm")) {
        assert.strictEqual(info.accelerator, "tcg")
        assert.match(info.detail, /\/dev\/kvm is absent/)
      }
      assert.match(info.detail, /QEMU \d+\.\d+\.\d+/)
    }))

  it.live("park keeps the guest resident and paused; unpark continues its counter", () =>
    Effect.gen(function* () {
      const { rt } = hosts.A
      yield* rt.park(calm.vmId)
      assert.isFalse((yield* statusOf(rt, calm.vmId)).running)
      const [usage] = yield* rt.usage
      assert.strictEqual(usage?.status, "paused")
      assert.isTrue((usage?.rssBytes ?? 0) > 64 * 1024 * 1024, `RSS ${usage?.rssBytes} of a parked 128 MiB guest stays resident`)
      const before = lastTick(rt, calm.vmId)
      yield* rt.unpark(calm.vmId)
      assert.isTrue((yield* statusOf(rt, calm.vmId)).running)
      yield* awaitTick(rt.consolePath(calm.vmId), continuedFrom(before), "counter after unpark")
      assert.deepStrictEqual((yield* rt.list).map((v) => [v.vmId, v.status]), [[calm.vmId, "running"]])
    }))

  it.live("a descent frees the QEMU process; the restore continues the counter, no reboot", () =>
    Effect.gen(function* () {
      const { rt } = hosts.A
      const store = ImageStore.directory(mkdtempSync(join(tmpdir(), "eq-images-")))
      const pid = rt.pidOf(calm.vmId)
      assert.isDefined(pid)
      const before = lastTick(rt, calm.vmId)
      const image = yield* rt.descend(calm.vmId, yield* store.prepare(calm.vmId))
      assert.isFalse(QemuProcess.alive(pid!), "the QEMU process is gone while descended")
      assert.deepStrictEqual(yield* rt.list, [])
      assert.deepStrictEqual(yield* rt.usage, [])
      assert.isTrue(image.bytes > 1024 * 1024)
      assert.deepStrictEqual(yield* store.get(calm.vmId), image)
      const back = yield* rt.restore(calm, image)
      assert.strictEqual(back.status, "running")
      assert.notStrictEqual(rt.pidOf(calm.vmId), pid)
      yield* awaitTick(rt.consolePath(calm.vmId), continuedFrom(before), "counter after restore")
      assert.strictEqual(boots(rt.consolePath(calm.vmId)), 0, "no boot banner since the restore: the guest continued")
    }))

  it.live("a live move within budget commits with its phases; the counter continues on the target and the source QEMU is gone", () =>
    Effect.gen(function* () {
      const A = hosts.A.rt
      const B = hosts.B.rt
      const sourcePid = A.pidOf(calm.vmId)!
      const before = lastTick(A, calm.vmId)
      const reported: MoveRound[] = []
      const out = yield* Move.between(A, B, calm.vmId, {
        moveId: "m-commit",
        budget: { maxDowntimeMs: 5000, commitAllowanceMs: 400, maxPreCopyRounds: 8 },
        onRound: (r) => Effect.sync(() => void reported.push(r)),
      })
      console.log("committed move:", JSON.stringify(out))
      assert.strictEqual(out._tag, "Committed")
      if (out._tag !== "Committed") return
      assert.isTrue(Downtime.phasesConsistent(out.phases), JSON.stringify(out.phases))
      assert.isTrue(out.phases.downtimeMs <= 5000)
      assert.strictEqual(out.rounds[0]?.kind, "full")
      assert.strictEqual(out.rounds.at(-1)?.kind, "final")
      assert.deepStrictEqual(reported, out.rounds.slice(0, -1), "every pre-copy round was reported")
      assert.isNumber(out.runtimeDowntimeMs)
      assert.isFalse(QemuProcess.alive(sourcePid), "the source QEMU is gone")
      assert.deepStrictEqual(yield* A.list, [])
      assert.deepStrictEqual((yield* B.list).map((v) => [v.vmId, v.status]), [[calm.vmId, "running"]])
      yield* awaitTick(B.consolePath(calm.vmId), continuedFrom(before), "counter on the target")
    }))

  it.live("a budget below the commit allowance is refused before the move starts; the target keeps no QEMU", () =>
    Effect.gen(function* () {
      const A = hosts.A.rt
      const B = hosts.B.rt
      const out = yield* Move.between(B, A, calm.vmId, { moveId: "m-tiny", budget: { maxDowntimeMs: 50, commitAllowanceMs: 400, maxPreCopyRounds: 8 } })
      assert.strictEqual(out._tag, "Refused")
      if (out._tag !== "Refused") return
      assert.strictEqual(out.stage, "pre-pause")
      assert.match(out.reason, /^ErrMoveDowntime: pre-pause estimate 400 ms > maxDowntimeMs 50 ms/)
      assert.deepStrictEqual(out.rounds, [])
      assert.isNull(out.pausedMs)
      assert.isTrue((yield* statusOf(B, calm.vmId)).running)
      assert.deepStrictEqual(yield* A.list, [])
      assert.isFalse(existsSync(join(hosts.A.stateDir, calm.vmId)), "the target's incoming VM and its files are gone")
      const before = lastTick(B, calm.vmId)
      yield* awaitTick(B.consolePath(calm.vmId), continuedFrom(before), "counter on the source")
    }))

  it.live("a guest that dirties memory faster than its link is refused after its pre-copy rounds, before any pause", () =>
    Effect.gen(function* () {
      const C = hosts.C.rt
      const B = hosts.B.rt
      yield* C.start(hot)
      yield* awaitTick(C.consolePath(hot.vmId), (t) => t.n >= 2, "hot guest boots")
      let targetPid: number | undefined
      const out = yield* Move.between(C, B, hot.vmId, {
        moveId: "m-hot",
        budget: { maxDowntimeMs: 600, commitAllowanceMs: 400, maxPreCopyRounds: 3 },
        onRound: () => Effect.sync(() => void (targetPid ??= B.pidOf(hot.vmId))),
      })
      console.log("refused move:", JSON.stringify(out))
      assert.strictEqual(out._tag, "Refused")
      if (out._tag !== "Refused") return
      assert.strictEqual(out.stage, "pre-pause", "refused before the guest paused")
      assert.match(out.reason, /^ErrMoveDowntime: pre-pause estimate \d+ ms > maxDowntimeMs 600 ms/)
      assert.isTrue(out.rounds.length >= 2 && out.rounds[0]?.kind === "full" && out.rounds[1]?.kind === "delta", JSON.stringify(out.rounds))
      assert.isTrue(out.estimateMs > 600)
      assert.isTrue((yield* statusOf(C, hot.vmId)).running)
      assert.isDefined(targetPid, "the target had an incoming QEMU during the rounds")
      assert.isTrue(yield* QemuProcess.awaitExit(targetPid!, 10_000), "the target's QEMU is gone")
      assert.deepStrictEqual(yield* B.list.pipe(Effect.map((l) => l.filter((v) => v.vmId === hot.vmId))), [])
      const before = lastTick(C, hot.vmId)
      yield* awaitTick(C.consolePath(hot.vmId), continuedFrom(before), "counter on the source")
      yield* C.destroy(hot.vmId)
    }))

  it.live("a move given back at pre-switchover resumes the guest on the source; the target's QEMU exits; the same move asked again gets a fresh incoming VM", () =>
    Effect.gen(function* () {
      const A = hosts.A.rt
      const B = hosts.B.rt
      const endpoint = yield* A.prepareIncoming(calm, "m-abort")
      const targetPid = A.pidOf(calm.vmId)!
      // Asked again before any stream (a lost answer): the same incoming VM.
      assert.deepStrictEqual(yield* A.prepareIncoming(calm, "m-abort"), endpoint)
      assert.strictEqual(A.pidOf(calm.vmId), targetPid)
      const at = yield* B.migrate(calm.vmId, {
        moveId: "m-abort",
        endpoint,
        budget: { maxDowntimeMs: 5000, commitAllowanceMs: 400, maxPreCopyRounds: 8 },
        onRound: () => Effect.void,
      })
      assert.strictEqual(at._tag, "AtSwitchover")
      if (at._tag !== "AtSwitchover") return
      const paused = yield* statusOf(B, calm.vmId)
      assert.isFalse(paused.running, `the guest waits paused at the check point (${paused.status})`)
      assert.strictEqual(at.final.sendMs, 0)
      assert.isTrue(at.captureMs > 0)
      const before = lastTick(B, calm.vmId)
      yield* at.abort
      assert.isTrue((yield* statusOf(B, calm.vmId)).running)
      yield* awaitTick(B.consolePath(calm.vmId), continuedFrom(before), "counter on the source after the abort")
      assert.isTrue(yield* QemuProcess.awaitExit(targetPid, 10_000), "the target's QEMU exits on the failed load")
      // Asked again after its stream began and failed (a source that restarted the move): a new one.
      const again = yield* A.prepareIncoming(calm, "m-abort")
      assert.notStrictEqual(A.pidOf(calm.vmId), targetPid)
      assert.isTrue(QemuProcess.alive(A.pidOf(calm.vmId)!))
      assert.match(again.uri, /^tcp:127\.0\.0\.1:\d+$/)
      yield* A.destroy(calm.vmId)
      assert.deepStrictEqual(yield* A.list, [])
      assert.isFalse(existsSync(join(hosts.A.stateDir, calm.vmId)))
    }))

  it.live("after an agent restart a new runtime adopts the live VMs by their QMP sockets", () =>
    Effect.gen(function* () {
      const pid = hosts.B.rt.pidOf(calm.vmId)!
      // The old agent goes away: its QMP connections close, the VM keeps running.
      yield* Scope.close(hosts.B.scope, Exit.void)
      const again = yield* Effect.promise(() => openHost(hosts.B.stateDir, hosts.B.bandwidth))
      hosts.B = again
      const B = again.rt
      assert.deepStrictEqual(yield* B.list, [], "nothing known before recovery")
      const recovered = yield* B.recover([])
      assert.deepStrictEqual(recovered, [{ ...calm, status: "running" }])
      assert.strictEqual(B.pidOf(calm.vmId), pid, "the same QEMU process")
      const before = lastTick(B, calm.vmId)
      yield* B.park(calm.vmId)
      yield* B.unpark(calm.vmId)
      yield* awaitTick(B.consolePath(calm.vmId), continuedFrom(before), "counter under the new runtime")
      assert.isTrue(((yield* B.usage)[0]?.rssBytes ?? 0) > 0)
      yield* B.destroy(calm.vmId)
      assert.isFalse(QemuProcess.alive(pid), "destroy ends the QEMU process")
      assert.deepStrictEqual(readdirSync(again.stateDir), [], "and removes its files")
    }))
})
