/**
 * The simulated VM runtime (the agent's default): a guest with a memory size that dirties its
 * memory at a rate up to a hot working set, captured and sent at configured speeds, restored in
 * a configured commit time. Every duration is an `Effect.sleep`, so tests run it on a TestClock
 * and the demo in real time; a round's capture and send times are the model's (what it sleeps), not
 * the wall time a busy machine took. Its move data plane is a `SimWire` (in-process or TCP) carrying
 * the captures' descriptions; its descent images are small JSON files in the image store. Its
 * templates are names with a size: a start from one takes `templateStartMs` instead of `startMs`.
 */
import { readFile, rename, stat, writeFile } from "node:fs/promises"
import { Effect, Layer, Ref } from "effect"
import * as MoveGuard from "./MoveGuard.js"
import {
  type AtSwitchover,
  type DescentImage,
  type Launch,
  type MigrateResult,
  type MoveRound,
  nowMs,
  RuntimeError,
  type TemplateInfo,
  type VmInfo,
  VmRuntime,
  type VmRuntimeShape,
  type VmSpec,
  type VmStarted,
} from "./Runtime.js"
import * as SimWire from "./SimWire.js"

const MiB = 1024 * 1024

/** The simulated guest and host figures. Rates are bytes per ms; durations ms. */
export interface SimConfig {
  /** Bytes the guest dirties per ms while it runs. */
  readonly dirtyBytesPerMs: number
  /** The dirty set saturates at the guest's hot working set. */
  readonly workingSetBytes: number
  /** Capture speed (bytes captured per ms) and the fixed cost of one capture. */
  readonly captureBytesPerMs: number
  readonly captureFixedMs: number
  /** Extra time of a final capture: a starved source (the seed 004 incident). */
  readonly finalCaptureExtraMs: number
  /**
   * From the guard's decision to pause (and the caller's `beforePause`) to the pause, while the
   * guest still runs: QEMU stops the guest at its next iteration. Default 0.
   */
  readonly pauseDelayMs: number
  /** Speed of the link to the peer agent. */
  readonly linkBytesPerMs: number
  /** Wire bytes per apparent byte of a full capture (zero pages compress). */
  readonly fullWireRatio: number
  /** Fixed bytes every round costs on the wire. */
  readonly roundOverheadBytes: number
  /** Restore plus resume on the target (a move's commit, a descent's restore). */
  readonly commitMs: number
  /** Boot time of a fresh VM (also what building a template takes). */
  readonly startMs: number
  /** A start from a template the runtime holds. */
  readonly templateStartMs: number
  /**
   * The modeled guest's activity: after it starts, resumes or is touched (`touch`) it is busy
   * (its CPU time grows with the wall clock) for this long, then quiet until the next of those.
   */
  readonly guestBusyMs: number
}

/**
 * Defaults shaped on seed 004's hardware run (a guest rewriting a hot 64 MiB): a delta
 * captures in ≈ 40 ms and sends in ≈ 85 ms, a commit takes ≈ 420 ms.
 */
export const defaultSimConfig: SimConfig = {
  dirtyBytesPerMs: 8 * MiB,
  workingSetBytes: 64 * MiB,
  captureBytesPerMs: 2 * MiB,
  captureFixedMs: 8,
  finalCaptureExtraMs: 0,
  pauseDelayMs: 0,
  linkBytesPerMs: 790_000,
  fullWireRatio: 0.05,
  roundOverheadBytes: 64 * 1024,
  commitMs: 420,
  startMs: 50,
  templateStartMs: 10,
  guestBusyMs: 30_000,
}

/** Runtime statistics of a simulated VM (tests). */
export interface SimStats {
  /** Bytes dirtied since the last capture while dirty tracking runs; 0 when it does not. */
  readonly dirtyBytes: number
  readonly tracking: boolean
}

/** The simulated runtime: the interface plus what tests inspect. */
export interface SimRuntimeShape extends VmRuntimeShape {
  readonly config: SimConfig
  /** Pauses taken for moves (the guard's "never paused" is `pauses` unchanged); a move of a guest already paused takes none. */
  readonly pauses: Ref.Ref<number>
  readonly stats: (vmId: string) => Effect.Effect<VmInfo & SimStats, RuntimeError>
  /** The modeled guest does some work now: busy again for `guestBusyMs` (its CPU time grows). */
  readonly touch: (vmId: string) => Effect.Effect<void, RuntimeError>
}

interface SimVm {
  readonly spec: VmSpec
  status: VmInfo["status"]
  tracking: boolean
  /** Dirty bytes accumulated since the last capture (before the working-set cap). */
  dirty: number
  settledAt: number
  seq: number
  /** CPU time the modeled guest has used (ms), up to `settledAt`. */
  cpuMs: number
  /** The modeled guest is busy until then (epoch ms). */
  busyUntil: number
}

interface Incoming {
  readonly spec: VmSpec
  readonly moveId: string
  readonly uri: string
  readonly close: Effect.Effect<void>
  frames: SimWire.SimFrame[]
}

/** The content of a simulated descent image. */
interface SimImage {
  readonly engram: "sim-image/v1"
  readonly vmId: string
  readonly memMib: number
  readonly vcpus: number
}

/** The modeled duration of `ms`, as the runtime sleeps it (whole milliseconds). */
const modeledMs = (ms: number) => (ms > 0 ? Math.ceil(ms) : 0)
const sleepMs = (ms: number) => (ms > 0 ? Effect.sleep(modeledMs(ms)) : Effect.void)
/**
 * Runs `eff`, answering the modeled duration `ms` rather than the wall time it took: the simulated
 * guest's link and capture are the model's, so a busy machine (a late timer, a slow loopback hop
 * carrying the frame) does not make the simulated guest look slower than configured.
 */
const modeled = <A, E, R>(ms: number, eff: Effect.Effect<A, E, R>) => Effect.map(eff, (a) => [a, modeledMs(ms)] as const)
const now = nowMs

/** Builds a simulated runtime on `wire` (default: the in-process wire). */
export const make = (config: Partial<SimConfig> = {}, wire: SimWire.SimWire = SimWire.inMemory()): Effect.Effect<SimRuntimeShape> =>
  Effect.gen(function* () {
    const cfg: SimConfig = { ...defaultSimConfig, ...config }
    const vms = yield* Ref.make(new Map<string, SimVm>())
    const incoming = yield* Ref.make(new Map<string, Incoming>())
    const pauses = yield* Ref.make(0)
    const templates = yield* Ref.make(new Map<string, TemplateInfo>())
    const fail = (op: string, vmId: string, message: string) => Effect.fail(new RuntimeError({ op, vmId, message }))
    /** A VM that runs, with how it came to: the simulated guest is ready when its process is. */
    const launched = (vm: VmInfo, launch: Omit<Launch, "readiness">): VmStarted => ({ ...vm, launch: { ...launch, readiness: "process" } })

    // Dirty bytes accrue only while the guest runs and tracking is on.
    const settle = (vm: SimVm, t: number) => {
      if (vm.status === "running" && vm.tracking) vm.dirty += cfg.dirtyBytesPerMs * (t - vm.settledAt)
      if (vm.status === "running") vm.cpuMs += Math.max(0, Math.min(t, vm.busyUntil) - vm.settledAt)
      vm.settledAt = t
    }
    const get = (op: string, vmId: string) =>
      Effect.flatMap(Ref.get(vms), (m) => {
        const vm = m.get(vmId)
        return vm === undefined ? fail(op, vmId, `no VM ${vmId} on this host`) : Effect.succeed(vm)
      })
    const withSettled = <A>(op: string, vmId: string, f: (vm: SimVm) => A) =>
      Effect.gen(function* () {
        const vm = yield* get(op, vmId)
        settle(vm, yield* now)
        return f(vm)
      })
    const info = (vm: SimVm): VmInfo => ({ ...vm.spec, status: vm.status })
    const add = (spec: VmSpec, status: VmInfo["status"]) =>
      Effect.gen(function* () {
        const t = yield* now
        const vm: SimVm = { spec, status, tracking: false, dirty: 0, settledAt: t, seq: 0, cpuMs: 0, busyUntil: t + cfg.guestBusyMs }
        yield* Ref.update(vms, (m) => new Map(m).set(spec.vmId, vm))
        return info(vm)
      })
    const remove = (vmId: string) =>
      Ref.update(vms, (m) => {
        const next = new Map(m)
        next.delete(vmId)
        return next
      })
    const dropIncoming = (vmId: string) =>
      Effect.gen(function* () {
        const inc = (yield* Ref.get(incoming)).get(vmId)
        if (inc === undefined) return
        yield* inc.close
        yield* Ref.update(incoming, (m) => {
          const next = new Map(m)
          next.delete(vmId)
          return next
        })
      })
    const notResident = (op: string, vmId: string) =>
      Effect.gen(function* () {
        if ((yield* Ref.get(vms)).has(vmId)) return yield* fail(op, vmId, "VM already resident")
      })
    const captureTimeMs = (apparentBytes: number) => cfg.captureFixedMs + apparentBytes / cfg.captureBytesPerMs
    const setStatus = (vmId: string, status: VmInfo["status"]) =>
      withSettled("status", vmId, (vm) => {
        // A guest that runs again (unparked, a move aborted) wakes busy.
        if (status === "running" && vm.status !== "running") vm.busyUntil = vm.settledAt + cfg.guestBusyMs
        vm.status = status
      })
    const stopTracking = (vmId: string) =>
      withSettled("stopTracking", vmId, (vm) => {
        vm.tracking = false
        vm.dirty = 0
      }).pipe(Effect.ignore)

    /** The full capture: the whole memory; (re)starts dirty tracking. */
    const fullCapture = (vmId: string) =>
      Effect.gen(function* () {
        const vm = yield* get("migrate", vmId)
        const apparentBytes = vm.spec.memMib * MiB
        yield* sleepMs(captureTimeMs(apparentBytes))
        const taken = yield* withSettled("migrate", vmId, (vm) => {
          vm.tracking = true
          vm.dirty = 0
          vm.seq = 0
          return { seq: 0, apparentBytes, wireBytes: Math.round(apparentBytes * cfg.fullWireRatio) + cfg.roundOverheadBytes }
        })
        return [taken, modeledMs(captureTimeMs(apparentBytes))] as const
      })
    /** A delta: the ranges dirty when it starts; what the guest dirties meanwhile is the next round's. */
    const deltaCapture = (vmId: string, kind: "delta" | "final") =>
      Effect.gen(function* () {
        const taken = yield* withSettled("migrate", vmId, (vm) => {
          const apparentBytes = Math.round(Math.min(cfg.workingSetBytes, vm.dirty))
          vm.dirty = 0
          vm.seq += 1
          return { apparentBytes, seq: vm.seq, wireBytes: apparentBytes + cfg.roundOverheadBytes }
        })
        const ms = captureTimeMs(taken.apparentBytes) + (kind === "final" ? cfg.finalCaptureExtraMs : 0)
        yield* sleepMs(ms)
        return [taken, modeledMs(ms)] as const
      })

    const migrate = <E>(vmId: string, req: Parameters<VmRuntimeShape["migrate"]>[1] & { readonly onRound: (r: MoveRound) => Effect.Effect<void, E> }) =>
      Effect.gen(function* () {
        const b = req.budget
        if (req.endpoint.runtime !== "sim") return yield* fail("migrate", vmId, `a ${req.endpoint.runtime} endpoint cannot take a simulated VM`)
        const vm = yield* get("migrate", vmId)
        // A paused copy migrated (a parked guest, a committed move's stream sent again) stays
        // paused when the pause is given back: only a guest that ran when the move began runs
        // again. Its move pauses it no further, so the guard refuses it nothing on an estimate.
        const wasRunning = vm.status === "running"
        const guest: MoveGuard.Guest = { alreadyPaused: !wasRunning }
        const upfront = MoveGuard.beforeStart(b, guest)
        if (upfront._tag === "Refuse") return { _tag: "Refused", stage: "pre-pause", estimateMs: upfront.estimateMs, reason: upfront.reason, rounds: [] } as MigrateResult
        const rounds: MoveRound[] = []
        let pausedAt: number | null = null
        const frame = (kind: MoveRound["kind"], c: { seq: number; apparentBytes: number; wireBytes: number }): SimWire.SimFrame => ({
          vmId,
          moveId: req.moveId,
          kind,
          seq: c.seq,
          apparentBytes: c.apparentBytes,
          wireBytes: c.wireBytes,
          memMib: vm.spec.memMib,
          vcpus: vm.spec.vcpus,
        })
        const send = (f: SimWire.SimFrame) => {
          const ms = f.wireBytes / cfg.linkBytesPerMs
          return modeled(ms, sleepMs(ms).pipe(Effect.andThen(wire.send(req.endpoint.uri, f))))
        }
        const preCopy = (kind: "full" | "delta", c: { seq: number; apparentBytes: number; wireBytes: number }, captureMs: number) =>
          Effect.gen(function* () {
            const [, sendMs] = yield* send(frame(kind, c))
            const round: MoveRound = { kind, wireBytes: c.wireBytes, apparentBytes: c.apparentBytes, sendMs, captureMs }
            rounds.push(round)
            yield* req.onRound(round)
          })
        const giveBack = Effect.gen(function* () {
          if (pausedAt !== null && wasRunning) yield* setStatus(vmId, "running").pipe(Effect.ignore)
          yield* stopTracking(vmId)
        })

        const protocol = Effect.gen(function* () {
          const [full, fullMs] = yield* fullCapture(vmId)
          yield* preCopy("full", full, fullMs)
          for (;;) {
            const step = MoveGuard.afterRound(rounds, b, guest)
            if (step._tag === "Refuse") {
              // The caller may hold the move committed: then it goes on over budget.
              if (req.overBudget !== undefined && (yield* req.overBudget({ stage: "pre-pause", estimateMs: step.estimateMs, reason: step.reason }))) break
              yield* stopTracking(vmId)
              return { _tag: "Refused", stage: "pre-pause", estimateMs: step.estimateMs, reason: step.reason, rounds } as MigrateResult
            }
            if (step._tag === "Pause") break
            const [delta, deltaMs] = yield* deltaCapture(vmId, "delta")
            yield* preCopy("delta", delta, deltaMs)
          }
          // The guest still runs: the caller's last word before the pause.
          if (req.beforePause !== undefined) yield* req.beforePause
          if (cfg.pauseDelayMs > 0) yield* sleepMs(cfg.pauseDelayMs)
          // Paused: the downtime runs from here to the target's resume (a guest already paused
          // is not paused again: no pause of the move's own is counted).
          const paused = yield* now
          pausedAt = paused
          if (wasRunning) yield* Ref.update(pauses, (n) => n + 1)
          yield* setStatus(vmId, "paused")
          const [final, captureMs] = yield* deltaCapture(vmId, "final")
          const post = MoveGuard.postCapture(rounds, { captureMs, apparentBytes: final.apparentBytes }, b, guest)
          if (post._tag === "Overrun" && !(req.overBudget !== undefined && (yield* req.overBudget({ stage: "post-capture", estimateMs: post.estimateMs, reason: post.reason })))) {
            yield* giveBack
            const pausedMs = (yield* now) - paused
            return { _tag: "Aborted", stage: "post-capture", estimateMs: post.estimateMs, reason: post.reason, rounds, captureMs, pausedMs } as MigrateResult
          }
          const finalFrame = frame("final", final)
          const at: AtSwitchover = {
            _tag: "AtSwitchover",
            rounds,
            unreported: [],
            final: { kind: "final", wireBytes: final.wireBytes, apparentBytes: final.apparentBytes, sendMs: 0, captureMs },
            estimateMs: post.estimateMs,
            alreadyPaused: !wasRunning,
            pausedAtMs: paused,
            captureMs,
            selfConverged: false,
            switchover: Effect.gen(function* () {
              const [, sendMs] = yield* send(finalFrame)
              yield* stopTracking(vmId)
              return { sendMs, sentAtMs: yield* now, finalWireBytes: final.wireBytes, runtimeDowntimeMs: null }
            }).pipe(Effect.tapError(() => giveBack)),
            abort: giveBack,
          }
          return at as MigrateResult
        })
        return yield* protocol.pipe(Effect.tapError(() => giveBack))
      })

    const runtime: SimRuntimeShape = {
      config: cfg,
      pauses,
      info: Effect.succeed({ kind: "sim", accelerator: "sim", detail: `simulated guests (link ${cfg.linkBytesPerMs} B/ms, commit ${cfg.commitMs} ms)` }),
      start: (spec, options) =>
        Effect.gen(function* () {
          yield* notResident("start", spec.vmId)
          const name = options?.template
          if (name === undefined) {
            yield* sleepMs(cfg.startMs)
            return launched(yield* add(spec, "running"), { from: "boot", method: null, template: null, readyMs: cfg.startMs, detail: "simulated boot" })
          }
          const t = (yield* Ref.get(templates)).get(name)
          if (t === undefined) return yield* fail("start", spec.vmId, `no template ${name} on this host`)
          if (t.memMib !== spec.memMib || t.vcpus !== spec.vcpus) {
            return yield* fail("start", spec.vmId, `template ${name} is ${t.memMib} MiB / ${t.vcpus} vCPUs; the VM asks ${spec.memMib} MiB / ${spec.vcpus} vCPUs`)
          }
          yield* sleepMs(cfg.templateStartMs)
          return launched(yield* add(spec, "running"), { from: "template", method: t.method, template: name, readyMs: cfg.templateStartMs, detail: "simulated template start" })
        }),
      templates: Effect.map(Ref.get(templates), (m) => [...m.values()]),
      buildTemplate: (t) =>
        Effect.gen(function* () {
          yield* sleepMs(cfg.startMs + captureTimeMs(t.memMib * MiB))
          const info: TemplateInfo = { ...t, bytes: t.memMib * MiB, method: "stream" }
          yield* Ref.update(templates, (m) => new Map(m).set(t.name, info))
          return info
        }),
      removeTemplate: (name) =>
        Ref.update(templates, (m) => {
          const next = new Map(m)
          next.delete(name)
          return next
        }),
      park: (vmId) => setStatus(vmId, "paused"),
      unpark: (vmId) => setStatus(vmId, "running"),
      descend: (vmId, path) =>
        Effect.gen(function* () {
          const vm = yield* get("descend", vmId)
          yield* sleepMs(captureTimeMs(vm.spec.memMib * MiB))
          const image: SimImage = { engram: "sim-image/v1", vmId, memMib: vm.spec.memMib, vcpus: vm.spec.vcpus }
          const bytes = yield* Effect.tryPromise({
            try: async () => {
              await writeFile(`${path}.tmp`, JSON.stringify(image))
              await rename(`${path}.tmp`, path)
              return (await stat(path)).size
            },
            catch: (e) => new RuntimeError({ op: "descend", vmId, message: `image write failed: ${String(e)}` }),
          })
          yield* remove(vmId)
          return { vmId, path, bytes, method: "stream", detail: "simulated capture" } satisfies DescentImage
        }),
      restore: (spec, image) =>
        Effect.gen(function* () {
          const text = yield* Effect.tryPromise({
            try: () => readFile(image.path, "utf8"),
            catch: (e) => new RuntimeError({ op: "restore", vmId: spec.vmId, message: `image read failed: ${String(e)}` }),
          })
          let parsed: Partial<SimImage> | null
          try {
            parsed = JSON.parse(text) as Partial<SimImage>
          } catch {
            parsed = null
          }
          if (parsed?.engram !== "sim-image/v1" || parsed.vmId !== spec.vmId) {
            return yield* fail("restore", spec.vmId, `${image.path} is not a simulated image of ${spec.vmId}`)
          }
          yield* notResident("restore", spec.vmId)
          yield* sleepMs(cfg.commitMs)
          return launched(yield* add(spec, "running"), { from: "image", method: "stream", template: null, readyMs: cfg.commitMs, detail: "simulated restore" })
        }),
      destroy: (vmId) => remove(vmId).pipe(Effect.andThen(dropIncoming(vmId))),
      list: Effect.map(Ref.get(vms), (m) => [...m.values()].map(info)),
      usage: Effect.gen(function* () {
        const t = yield* now
        return [...(yield* Ref.get(vms)).values()].map((vm) => {
          settle(vm, t)
          return { ...info(vm), rssBytes: vm.spec.memMib * MiB, ramBytes: vm.spec.memMib * MiB, pid: null, cpuMs: vm.cpuMs }
        })
      }),
      touch: (vmId) => Effect.asVoid(withSettled("touch", vmId, (vm) => void (vm.busyUntil = vm.settledAt + cfg.guestBusyMs))),
      recover: (known) =>
        Effect.gen(function* () {
          for (const k of known) {
            if (!(yield* Ref.get(vms)).has(k.vmId)) yield* add({ vmId: k.vmId, memMib: k.memMib, vcpus: k.vcpus }, k.status)
          }
          return yield* runtime.list
        }),
      prepareIncoming: (spec, moveId) =>
        Effect.gen(function* () {
          yield* notResident("prepareIncoming", spec.vmId)
          const existing = (yield* Ref.get(incoming)).get(spec.vmId)
          if (existing !== undefined) {
            if (existing.moveId === moveId) return { runtime: "sim", uri: existing.uri }
            yield* dropIncoming(spec.vmId)
          }
          const handler: SimWire.FrameHandler = (f) =>
            Effect.gen(function* () {
              const inc = (yield* Ref.get(incoming)).get(spec.vmId)
              if (inc === undefined || f.vmId !== spec.vmId || f.moveId !== moveId) return yield* fail("receive", spec.vmId, "no incoming VM for this frame")
              // A full round (re)starts the staging: a source that restarted the move begins again.
              if (f.kind === "full") inc.frames = [f]
              else if (inc.frames.length === 0) return yield* fail("receive", spec.vmId, `a ${f.kind} round before the full round`)
              else inc.frames = [...inc.frames, f]
            })
          const listener = yield* wire.listen(spec.vmId, handler)
          yield* Ref.update(incoming, (m) => new Map(m).set(spec.vmId, { spec, moveId, uri: listener.uri, close: listener.close, frames: [] }))
          return { runtime: "sim", uri: listener.uri }
        }),
      commitIncoming: (vmId) =>
        Effect.gen(function* () {
          const inc = (yield* Ref.get(incoming)).get(vmId)
          if (inc === undefined) return yield* fail("commitIncoming", vmId, "no incoming VM")
          const ok =
            inc.frames[0]?.kind === "full" && inc.frames.at(-1)?.kind === "final" && inc.frames.every((f, i) => f.seq === i)
          if (!ok) {
            yield* dropIncoming(vmId)
            return yield* fail("commitIncoming", vmId, "the stream is not a full round, its deltas and a final round in order")
          }
          yield* sleepMs(cfg.commitMs)
          yield* dropIncoming(vmId)
          return yield* add(inc.spec, "running")
        }),
      migrate: migrate as VmRuntimeShape["migrate"],
      stats: (vmId) =>
        withSettled("stats", vmId, (vm) => ({
          ...info(vm),
          dirtyBytes: vm.tracking ? Math.min(cfg.workingSetBytes, vm.dirty) : 0,
          tracking: vm.tracking,
        })),
    }
    return runtime
  })

/** The simulated runtime as a layer. */
export const layer = (config: Partial<SimConfig> = {}, wire?: SimWire.SimWire) => Layer.effect(VmRuntime, make(config, wire))
