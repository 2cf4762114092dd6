/**
 * The simulated VM runtime (the default): a guest with a memory size that dirties its memory
 * at a rate up to a hot working set, captured and sent at configured speeds, and restored in a
 * configured commit time. Every duration is an `Effect.sleep`, so tests run it on a TestClock
 * and the demo in real time.
 */
import { Clock, Effect, Layer, Ref } from "effect"
import { type Capture, RuntimeError, type VmInfo, VmRuntime, type VmRuntimeShape, type VmSpec, type VmStats } from "./Runtime.js"

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
  /** Speed of the link to the peer agent. */
  readonly linkBytesPerMs: number
  /** Wire bytes per apparent byte of a full capture (zero pages compress). */
  readonly fullWireRatio: number
  /** Fixed bytes every round costs on the wire. */
  readonly roundOverheadBytes: number
  /** Restore plus resume on the target. */
  readonly commitMs: number
  /** Boot time of a fresh VM. */
  readonly startMs: number
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
  linkBytesPerMs: 790_000,
  fullWireRatio: 0.05,
  roundOverheadBytes: 64 * 1024,
  commitMs: 420,
  startMs: 50,
}

interface SimVm {
  readonly spec: VmSpec
  status: VmInfo["status"]
  tracking: boolean
  /** Dirty bytes accumulated since the last capture (before the working-set cap). */
  dirty: number
  settledAt: number
  seq: number
}

interface Image {
  readonly vmId: string
  readonly kind: Capture["kind"]
  readonly seq: number
  readonly apparentBytes: number
  readonly memMib: number
}

const encoder = new TextEncoder()
const decoder = new TextDecoder()
const encodeImage = (i: Image): Uint8Array => encoder.encode(JSON.stringify(i))
const decodeImage = (p: Uint8Array): Image | null => {
  try {
    const v = JSON.parse(decoder.decode(p)) as Partial<Image>
    return typeof v.vmId === "string" && typeof v.kind === "string" && typeof v.seq === "number" ? (v as Image) : null
  } catch {
    return null
  }
}

const sleepMs = (ms: number) => (ms > 0 ? Effect.sleep(Math.ceil(ms)) : Effect.void)

/** Builds a simulated runtime. */
export const makeSimRuntime = (config: Partial<SimConfig> = {}): Effect.Effect<VmRuntimeShape> =>
  Effect.gen(function* () {
    const cfg: SimConfig = { ...defaultSimConfig, ...config }
    const vms = yield* Ref.make(new Map<string, SimVm>())

    // Dirty bytes accrue only while the guest runs and tracking is on.
    const settle = (vm: SimVm, now: number) => {
      if (vm.status === "running" && vm.tracking) vm.dirty += cfg.dirtyBytesPerMs * (now - vm.settledAt)
      vm.settledAt = now
    }
    const get = (op: string, vmId: string) =>
      Effect.flatMap(Ref.get(vms), (m) => {
        const vm = m.get(vmId)
        return vm === undefined ? Effect.fail(new RuntimeError({ op, vmId, message: `no VM ${vmId} on this host` })) : Effect.succeed(vm)
      })
    const withSettled = <A>(op: string, vmId: string, f: (vm: SimVm, now: number) => A) =>
      Effect.gen(function* () {
        const vm = yield* get(op, vmId)
        const now = yield* Clock.currentTimeMillis
        settle(vm, now)
        return f(vm, now)
      })
    const info = (vm: SimVm): VmInfo => ({ ...vm.spec, status: vm.status })
    const add = (spec: VmSpec, status: VmInfo["status"]) =>
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const vm: SimVm = { spec, status, tracking: false, dirty: 0, settledAt: now, seq: 0 }
        yield* Ref.update(vms, (m) => new Map(m).set(spec.vmId, vm))
        return info(vm)
      })
    const captureTimeMs = (apparentBytes: number) => cfg.captureFixedMs + apparentBytes / cfg.captureBytesPerMs

    const runtime: VmRuntimeShape = {
      start: (spec) =>
        Effect.gen(function* () {
          if ((yield* Ref.get(vms)).has(spec.vmId)) {
            return yield* new RuntimeError({ op: "start", vmId: spec.vmId, message: "VM already resident" })
          }
          yield* sleepMs(cfg.startMs)
          return yield* add(spec, "running")
        }),
      pause: (vmId) => withSettled("pause", vmId, (vm) => void (vm.status = "paused")),
      resume: (vmId) => withSettled("resume", vmId, (vm) => void (vm.status = "running")),
      fullCapture: (vmId) =>
        Effect.gen(function* () {
          const vm = yield* get("fullCapture", vmId)
          const apparentBytes = vm.spec.memMib * MiB
          yield* sleepMs(captureTimeMs(apparentBytes))
          return yield* withSettled("fullCapture", vmId, (vm, _now): Capture => {
            vm.tracking = true
            vm.dirty = 0
            vm.seq = 0
            return {
              vmId,
              kind: "full",
              apparentBytes,
              wireBytes: Math.round(apparentBytes * cfg.fullWireRatio) + cfg.roundOverheadBytes,
              payload: encodeImage({ vmId, kind: "full", seq: 0, apparentBytes, memMib: vm.spec.memMib }),
            }
          })
        }),
      deltaCapture: (vmId, kind) =>
        Effect.gen(function* () {
          // The capture takes the ranges dirty when it starts; what the guest dirties meanwhile
          // belongs to the next round.
          const taken = yield* withSettled("deltaCapture", vmId, (vm) => {
            const apparentBytes = Math.round(Math.min(cfg.workingSetBytes, vm.dirty))
            vm.dirty = 0
            vm.seq += 1
            return { apparentBytes, seq: vm.seq, tracking: vm.tracking, memMib: vm.spec.memMib }
          })
          if (!taken.tracking) {
            return yield* new RuntimeError({ op: "deltaCapture", vmId, message: "no full capture started dirty tracking" })
          }
          yield* sleepMs(captureTimeMs(taken.apparentBytes) + (kind === "final" ? cfg.finalCaptureExtraMs : 0))
          return {
            vmId,
            kind,
            apparentBytes: taken.apparentBytes,
            wireBytes: taken.apparentBytes + cfg.roundOverheadBytes,
            payload: encodeImage({ vmId, kind, seq: taken.seq, apparentBytes: taken.apparentBytes, memMib: taken.memMib }),
          }
        }),
      stopTracking: (vmId) =>
        withSettled("stopTracking", vmId, (vm) => {
          vm.tracking = false
          vm.dirty = 0
        }),
      restore: (spec, images) =>
        Effect.gen(function* () {
          const decoded = images.map((c) => decodeImage(c.payload))
          const ok =
            decoded.length > 0 &&
            decoded[0]?.kind === "full" &&
            decoded.every((d, i) => d !== null && d.vmId === spec.vmId && d.seq === i)
          if (!ok) return yield* new RuntimeError({ op: "restore", vmId: spec.vmId, message: "images are not a full capture and its deltas in order" })
          if ((yield* Ref.get(vms)).has(spec.vmId)) {
            return yield* new RuntimeError({ op: "restore", vmId: spec.vmId, message: "VM already resident" })
          }
          yield* sleepMs(cfg.commitMs)
          return yield* add(spec, "paused")
        }),
      destroy: (vmId) =>
        Ref.update(vms, (m) => {
          const next = new Map(m)
          next.delete(vmId)
          return next
        }),
      stats: (vmId) =>
        withSettled("stats", vmId, (vm): VmStats => ({
          ...info(vm),
          dirtyBytes: vm.tracking ? Math.min(cfg.workingSetBytes, vm.dirty) : 0,
          tracking: vm.tracking,
        })),
      list: Effect.map(Ref.get(vms), (m) => [...m.values()].map(info)),
      recover: (known) =>
        Effect.gen(function* () {
          for (const k of known) {
            if (!(yield* Ref.get(vms)).has(k.vmId)) yield* add({ vmId: k.vmId, memMib: k.memMib, vcpus: k.vcpus }, k.status)
          }
          return yield* runtime.list
        }),
      paceSend: (wireBytes) => sleepMs(wireBytes / cfg.linkBytesPerMs),
    }
    return runtime
  })

/** The simulated runtime as a layer. */
export const layerSim = (config: Partial<SimConfig> = {}) => Layer.effect(VmRuntime, makeSimRuntime(config))
