/**
 * Captures of whole guests, and guests started from them: descents and restores, templates and
 * starts from a template. Two ways, chosen per guest and reported:
 *
 * - **mapped** (a guest whose RAM is a shared RAM file): only the devices go into a migration
 *   stream (`x-ignore-shared`, a few hundred KiB); the RAM file itself is the RAM. A descent
 *   fsyncs it and renames it into the image's directory (a sparse copy across filesystems), then
 *   QEMU exits; a restore links it back and maps it (`share=on`): pages fault in lazily, from
 *   the page cache or the disk, as the guest touches them. The image keeps its link until the
 *   state is loaded: a restore cut short before then (an agent or host crash) leaves the image
 *   whole, and recovery removes the VM's link. The image's link goes just before the guest runs
 *   (then the image's RAM would no longer match its devices). A template start copies the
 *   template's RAM file sparsely (only what the booted guest touched) and maps the copy.
 * - **stream** (anonymous RAM, a QEMU without `x-ignore-shared`, or a guest mapping its image
 *   privately): RAM and devices in one migration stream to a file, read back in full.
 */
import { copyFile, link, mkdir, readFile, realpath, rename, rm, stat, unlink } from "node:fs/promises"
import { dirname, join } from "node:path"
import { Names } from "@engram/core"
import { type DescentImage, Durable, type Launch, nowMs, type RuntimeError, type SnapshotMethod, type TemplateInfo, type TemplateSpec, type VmSpec, type VmStarted } from "@engram/runtime"
import { Effect } from "effect"
import * as M from "./QemuMigration.js"
import * as P from "./QemuProcess.js"
import * as RamFile from "./RamFile.js"
import * as Templates from "./Templates.js"
import { err, isInternal, type Vm, type VmHost } from "./VmHost.js"

/** The descent image's side file: the machine to restore it into, and how it holds the RAM. */
export interface ImageMachine {
  readonly engram: "qemu-image/v1"
  readonly spec: VmSpec
  readonly machine: P.Machine
  /** Absent in images of runtimes before RAM files: `stream`. */
  readonly method?: SnapshotMethod
  /** The RAM file's name in the image's directory (mapped). */
  readonly ram?: string
}

const ms = (x: number) => Math.round(x)
const mib = (bytes: number) => Math.round(bytes / (1024 * 1024))

/** Why a resident VM's capture must stream, or null when it can be mapped. */
export const streamReason = (h: VmHost, vm: Vm): string | null => {
  const ram = vm.record.ram
  if (!h.settings.snapshots.ignoreShared) return h.settings.snapshots.reason
  if (ram === undefined || ram.kind === "anonymous") return h.settings.snapshots.method === "stream" ? h.settings.snapshots.reason : "its RAM is anonymous"
  if (!ram.shared) return "its RAM is a private mapping of the image it was restored from (that image is on another filesystem than the RAM files)"
  return null
}

/**
 * Migrates a VM's state into the file `to` (its devices only with `ignoreShared`), the guest
 * stopped. Bounded by its progress: it fails once nothing was sent for `migrationTimeoutMs`. A
 * save that fails is cancelled, and waited for until QEMU says it ended: left running it would
 * go on writing `to`, and its end would stop the guest again (QEMU's `postmigrate`). A save an
 * earlier failure could not cancel (QEMU did not answer) is cancelled first, and a guest an
 * earlier stream left in `postmigrate` is taken out of it (`VmHost.leavePostmigrate`).
 */
const save = (h: VmHost, vm: Vm, op: string, to: string, ignoreShared: boolean, bandwidthBytesPerSec: number) =>
  Effect.scoped(
    Effect.gen(function* () {
      if ((yield* h.cancelMigration(vm, op)) === null) return yield* err(op, vm.spec.vmId, "QEMU did not say whether an earlier migration still runs")
      // A guest paused before a stream of it that was given back (a move's, or an earlier save's) is
      // in QEMU's `postmigrate`, from which QEMU saves nothing: taken out of it first.
      yield* h.leavePostmigrate(vm, op)
      const sub = yield* vm.client.subscribe
      yield* h.q(vm, op, "migrate-set-capabilities", M.capabilities({ pauseBeforeSwitchover: false, ignoreShared: h.settings.snapshots.ignoreShared ? ignoreShared : null }))
      yield* h.q(vm, op, "migrate-set-parameters", { "max-bandwidth": bandwidthBytesPerSec })
      yield* h.q(vm, op, "migrate", { uri: `exec:cat > ${M.shellQuote(to)}` })
      yield* h.awaitMigrationEnd(vm, op, sub).pipe(Effect.tapError(() => h.cancelMigration(vm, op)))
    }),
  )

/** Loads a saved state from `from` into an incoming VM (its RAM already in place with `ignoreShared`); it fails once nothing loaded for `migrationTimeoutMs` (its caller ends the VM). */
const load = (h: VmHost, vm: Vm, op: string, from: string, ignoreShared: boolean) =>
  Effect.scoped(
    Effect.gen(function* () {
      const sub = yield* vm.client.subscribe
      yield* h.q(vm, op, "migrate-set-capabilities", M.capabilities({ pauseBeforeSwitchover: false, ignoreShared: h.settings.snapshots.ignoreShared ? ignoreShared : null }))
      yield* h.q(vm, op, "migrate-incoming", { uri: `exec:cat ${M.shellQuote(from)}` })
      // QEMU shows an incoming migration's status only: its progress is the RAM it has filled.
      yield* h.awaitMigrationEnd(vm, op, sub, { kind: "progress", ms: h.settings.migrationTimeoutMs, measure: "loaded" })
    }),
  )

const exists = (path: string) => Effect.promise(() => stat(path).then(() => true, () => false))

/** A path as `/proc/<pid>/maps` names it (symlinks resolved); the path itself when it cannot be resolved. */
const realPath = (path: string) => Effect.promise(() => realpath(path).catch(() => path))

const attempt = <A>(op: string, vmId: string, what: string, f: () => Promise<A>) =>
  Effect.tryPromise({ try: f, catch: (e) => err(op, vmId, `${what}: ${String(e)}`) })

/**
 * Captures the VM into `path` and ends it: mapped when its RAM is a shared file, else streamed.
 * Until the image is complete nothing is lost: a failure resumes a guest that ran, and a RAM
 * file already moved goes back.
 */
export const descend = (h: VmHost, vm: Vm, path: string, bandwidthBytesPerSec: number): Effect.Effect<DescentImage, RuntimeError> =>
  Effect.gen(function* () {
    const vmId = vm.spec.vmId
    const t0 = yield* nowMs
    const wasRunning = (yield* h.runStatus(vm, "descend")) === "running"
    const giveBack = wasRunning ? h.q(vm, "descend", "cont").pipe(Effect.ignore) : Effect.void
    const part = `${path}.part`
    const why = streamReason(h, vm)
    const ram = vm.record.ram
    // Stopped first: the image is one consistent capture.
    if (wasRunning) yield* h.q(vm, "descend", "stop")
    yield* save(h, vm, "descend", part, why === null, bandwidthBytesPerSec).pipe(Effect.tapError(() => giveBack))
    const t1 = yield* nowMs
    const imageRam = join(dirname(path), "ram")
    let placed: RamFile.Placed | null = null
    // A descent cut short after it moved the RAM file (the agent restarted, QEMU kept the guest
    // paused): the file this QEMU maps is the image's already.
    // Whether QEMU maps the image's RAM file must be known: a read of its memory map that stalls
    // (a QEMU stuck in the kernel) fails the descent as it is (the agent's pass tries it again), not
    // taken for "not moved" (the RAM file would then be looked for where it no longer is).
    const mapsImageRam = Effect.flatMap(realPath(imageRam), (real) => P.mapsFile(vm.pid, real, h.settings.testHooks?.readMaps === undefined ? {} : { read: h.settings.testHooks.readMaps })).pipe(
      Effect.mapError(() => err("descend", vmId, `its QEMU's memory map (/proc/${vm.pid}/maps) could not be read within ${P.readBoundMs} ms (QEMU stuck in the kernel?): whether its RAM file was already moved into the image is unknown`)),
      Effect.tapError(() => giveBack.pipe(Effect.andThen(Effect.promise(() => rm(part, { force: true }))))),
    )
    const movedBefore = why === null && ram?.kind === "file" && !(yield* exists(ram.path)) && (yield* mapsImageRam)
    if (movedBefore) {
      // The guest may have run since (unparked after the restart): its pages written as a place's.
      yield* RamFile.fsync(imageRam).pipe(Effect.mapError((e) => err("descend", vmId, `RAM file: ${e.message}`)))
      placed = "renamed"
    } else if (why === null && ram?.kind === "file") {
      placed = yield* RamFile.place(ram.path, imageRam).pipe(
        Effect.mapError((e) => err("descend", vmId, `RAM file: ${e.message}`)),
        Effect.tapError(() => giveBack.pipe(Effect.andThen(Effect.promise(() => rm(part, { force: true }))))),
      )
    }
    const t2 = yield* nowMs
    const side: ImageMachine = { engram: "qemu-image/v1", spec: vm.spec, machine: vm.record.machine, method: why === null ? "mapped" : "stream", ...(why === null ? { ram: "ram" } : {}) }
    // Durable before QEMU ends and the descent is answered (then the coordinator counts the
    // image as the guest's only copy): the saved state and the side file synced, then renamed
    // into place, then the directories that gained (the image's) or lost (the VM's: a RAM file
    // renamed out of it) an entry, or a crash of the host could bring back an empty image or the
    // RAM file in the VM's directory, where recovery removes it.
    const bytes = yield* attempt("descend", vmId, "image write failed", async () => {
      await Durable.replace(join(dirname(path), "machine.json"), JSON.stringify(side, null, 2))
      await Durable.syncPath(part)
      await rename(part, path)
      await Durable.syncDir(dirname(path))
      // The image's own directory is new at a first descent: an entry of the images' root.
      await Durable.syncDir(dirname(dirname(path)))
      if (placed === "renamed" && ram?.kind === "file") await Durable.syncDir(dirname(ram.path))
      return (await stat(path)).size
    }).pipe(Effect.tapError(() => (placed === "renamed" && ram?.kind === "file" ? RamFile.putBack(imageRam, ram.path) : Effect.void).pipe(Effect.andThen(giveBack))))
    yield* h.finish(vm)
    const t3 = yield* nowMs
    const ramBytes = why === null ? yield* RamFile.allocatedBytes(imageRam) : 0
    const detail =
      why === null
        ? `mapped: devices saved in ${ms(t1 - t0)} ms (${Math.round(bytes / 1024)} KiB); RAM file (${mib(ramBytes)} MiB used) fsynced and ${placed} in ${ms(t2 - t1)} ms; QEMU ended in ${ms(t3 - t2)} ms`
        : `stream (${why}): RAM and devices streamed in ${ms(t1 - t0)} ms (${mib(bytes)} MiB); QEMU ended in ${ms(t3 - t2)} ms`
    return { vmId, path, bytes: bytes + ramBytes, method: side.method ?? "stream", detail } satisfies DescentImage
  })

/** Reads an image's side file (absent: the machine this runtime would boot, a stream image). */
const readSide = (image: DescentImage) =>
  Effect.tryPromise(() => readFile(join(dirname(image.path), "machine.json"), "utf8")).pipe(
    Effect.map((t) => JSON.parse(t) as Partial<ImageMachine>),
    Effect.orElseSucceed((): Partial<ImageMachine> => ({})),
  )

/** What a restore or template start needs to launch and load. */
interface Incoming {
  readonly ram: RamFile.RamBacking
  readonly fresh: boolean
  readonly mapped: boolean
  /** The image's RAM file the VM's is a second link of, until `commit` (a mapped restore). */
  readonly ramOrigin?: string
  /** Just before the guest runs: what the start from here on owns alone (the image's link removed). */
  readonly commit: Effect.Effect<void, RuntimeError>
  /** Undoes what was made for the launch (the VM's link or copy), when it fails before `commit`. */
  readonly undo: Effect.Effect<void>
  readonly note: string
}

/** Launches an incoming VM on `incoming`, loads `state`, resumes it and waits for its guest: the restore and template-start path. */
const startFrom = (h: VmHost, spec: VmSpec, m: P.Machine, state: string, incoming: Incoming, op: string, t0: number) =>
  Effect.gen(function* () {
    const hook = (stage: "launched" | "loaded") => h.settings.testHooks?.startFrom?.(spec.vmId, stage) ?? Effect.void
    const vm = yield* h
      .launch(spec, m, { incomingMoveId: null, incoming: true, ram: incoming.ram, fresh: incoming.fresh, ...(incoming.ramOrigin === undefined ? {} : { ramOrigin: incoming.ramOrigin }) })
      .pipe(Effect.tapError(() => incoming.undo))
    yield* hook("launched")
    const t1 = yield* nowMs
    yield* load(h, vm, op, state, incoming.mapped).pipe(Effect.andThen(hook("loaded")), Effect.andThen(incoming.commit), Effect.tapError(() => incoming.undo.pipe(Effect.andThen(h.finish(vm)))))
    const t2 = yield* nowMs
    const ready = yield* h.resume(vm, op, t0).pipe(Effect.tapError(() => h.finish(vm)))
    const t3 = yield* nowMs
    const parts = `QEMU up in ${ms(t1 - t0)} ms, state loaded in ${ms(t2 - t1)} ms, ${ready.readiness === "guest" ? "the guest said ready" : "running"} ${ms(t3 - t2)} ms after cont`
    return { vm, ready, parts }
  })

/** Restores a VM from a descent's image: mapped (the RAM file linked back and mapped lazily, the image spent once the guest runs) or streamed. */
export const restore = (h: VmHost, spec: VmSpec, image: DescentImage, machineFor: (spec: VmSpec) => P.Machine): Effect.Effect<VmStarted, RuntimeError> =>
  Effect.gen(function* () {
    const t0 = yield* nowMs
    const side = yield* readSide(image)
    if (side.spec !== undefined && side.spec.vmId !== spec.vmId) return yield* err("restore", spec.vmId, `${image.path} is an image of ${side.spec.vmId}`)
    const m = side.machine ?? machineFor(spec)
    const mapped = side.method === "mapped"
    if (mapped && !h.settings.snapshots.ignoreShared) return yield* err("restore", spec.vmId, `${image.path} is a mapped image and ${h.settings.snapshots.reason}`)
    const incoming = mapped ? yield* mappedIncoming(h, spec.vmId, image.path, join(dirname(image.path), side.ram ?? "ram")) : streamIncoming(h, spec.vmId, "a stream image")
    const { vm, ready, parts } = yield* startFrom(h, spec, m, image.path, incoming, "restore", t0)
    const launch: Launch = {
      from: "image",
      method: mapped ? "mapped" : "stream",
      template: null,
      readyMs: ready.readyMs,
      readiness: ready.readiness,
      detail: [`${mapped ? "mapped" : "stream"}: ${incoming.note}`, parts, ready.note].filter((x) => x !== "").join("; "),
    }
    return { ...vm.spec, status: vm.status, launch }
  })

/**
 * The RAM of a VM restored from a mapped image's RAM file: linked into the VM's RAM directory
 * and mapped shared (the VM owns it; its next descent is mapped), the image's link removed at
 * `commit`, and its device state with it (the image is spent: listed no more, so a later restore
 * after a crash boots fresh instead of failing on it, and no peer fetches it); across
 * filesystems, mapped privately where it is (nothing copied, the image's file unchanged; its
 * next descent streams).
 */
const mappedIncoming = (h: VmHost, vmId: string, imagePath: string, imageRam: string) =>
  Effect.gen(function* () {
    // Before any file is touched: the name below is a resident VM's RAM file.
    yield* h.ensureFree("restore", vmId)
    // An image spent by an earlier restore that was cut short between its two removals.
    if (!(yield* exists(imageRam))) {
      return yield* err("restore", vmId, `${imagePath} is a mapped image without its RAM file (${imageRam}): spent by an earlier restore, or damaged`)
    }
    const own = h.ramPathFor(vmId)
    yield* h.prepareRamDir(vmId)
    if (yield* RamFile.sameFilesystem(imageRam, dirname(own))) {
      // A link left by a restore cut short before its VM's record was written is replaced.
      yield* attempt("restore", vmId, "RAM file", async () => {
        await rm(own, { force: true })
        await link(imageRam, own)
      })
      return {
        ram: { kind: "file", path: own, shared: true },
        fresh: false,
        mapped: true,
        ramOrigin: imageRam,
        // Durable before the guest runs: after a crash the image must not name RAM its devices no longer match.
        commit: attempt("restore", vmId, "image RAM link", async () => {
          await unlink(imageRam)
          // Not durably gone: the image gets its link back, and the restore fails whole. When the
          // link cannot come back, the VM's name is the RAM's last: the guest goes on (failing
          // here would remove it with the VM's files), the unlink's durability unknown.
          await Durable.syncDir(dirname(imageRam)).catch(async (e: unknown) => {
            if (await link(own, imageRam).then(() => true, () => false)) throw e
          })
          // The spent image's devices: best effort (the check above catches one left behind).
          await rm(imagePath, { force: true }).then(() => Durable.syncDir(dirname(imagePath))).catch(() => undefined)
        }),
        undo: Effect.promise(() => rm(own, { force: true })),
        note: "the RAM file linked back and mapped (pages fault in as the guest touches them)",
      } satisfies Incoming
    }
    return {
      ram: { kind: "file", path: imageRam, shared: false },
      fresh: false,
      mapped: true,
      commit: Effect.void,
      undo: Effect.void,
      note: "the image's RAM file mapped privately where it is (another filesystem than the RAM files: the next descent streams)",
    } satisfies Incoming
  })

const streamIncoming = (h: VmHost, vmId: string, what: string): Incoming => ({ ram: h.freshRam(vmId), fresh: true, mapped: false, commit: Effect.void, undo: Effect.void, note: `${what}, read back in full` })

/** The VM id of a template's build (internal: no session id starts with `@`). */
const builderId = (name: string) => `@template-${name}`

/**
 * Builds the template `t`: boots a guest of its size, waits until it is ready, stops it and
 * keeps its devices and RAM (mapped: the RAM file renamed aside; stream: in the state file),
 * with its console, then ends it. Built aside and renamed into place.
 */
export const buildTemplate = (h: VmHost, t: TemplateSpec, machine: P.Machine, bandwidthBytesPerSec: number): Effect.Effect<TemplateInfo, RuntimeError> =>
  Effect.gen(function* () {
    const spec: VmSpec = { vmId: builderId(t.name), memMib: t.memMib, vcpus: t.vcpus }
    if (!Templates.validName(t.name)) return yield* err("buildTemplate", spec.vmId, `a template name ${Names.templateNameRule}: ${JSON.stringify(t.name)}`)
    const part = Templates.partOf(h.settings.stateDir, t.name)
    yield* Templates.remove(part)
    yield* attempt("buildTemplate", spec.vmId, "template directory", () => mkdir(part.dir, { recursive: true }))
    const t0 = yield* nowMs
    const vm = yield* h.launch(spec, machine, { incomingMoveId: null, incoming: false, ram: h.freshRam(spec.vmId), fresh: true })
    const build = Effect.gen(function* () {
      yield* h.awaitReady(vm, "buildTemplate", "boot", 0, t0)
      yield* h.q(vm, "buildTemplate", "stop")
      const why = streamReason(h, vm)
      yield* save(h, vm, "buildTemplate", part.state, why === null, bandwidthBytesPerSec)
      const ram = vm.record.ram
      if (why === null && ram?.kind === "file") yield* RamFile.place(ram.path, part.ram).pipe(Effect.mapError((e) => err("buildTemplate", spec.vmId, `RAM file: ${e.message}`)))
      yield* attempt("buildTemplate", spec.vmId, "console", () => copyFile(vm.paths.console, join(part.dir, "console.log")))
      const method: SnapshotMethod = why === null ? "mapped" : "stream"
      yield* Templates.commit(h.settings.stateDir, part, { engram: "qemu-template/v1", spec: t, machine, method }).pipe(Effect.mapError((e) => err("buildTemplate", spec.vmId, e.message)))
      return method
    })
    const method = yield* build.pipe(Effect.ensuring(h.finish(vm)), Effect.tapError(() => Templates.remove(part)))
    return { ...t, method, bytes: yield* Templates.bytesOf(Templates.pathsOf(h.settings.stateDir, t.name)) } satisfies TemplateInfo
  })

/** Starts `spec` from the template `name`: its RAM copied sparsely and mapped (mapped), or its stream loaded. */
export const startFromTemplate = (h: VmHost, spec: VmSpec, name: string): Effect.Effect<VmStarted, RuntimeError> =>
  Effect.gen(function* () {
    const t0 = yield* nowMs
    const record = yield* Templates.read(h.settings.stateDir, name)
    if (record === undefined) return yield* err("start", spec.vmId, `no template ${name} on this host`)
    if (record.spec.memMib !== spec.memMib || record.spec.vcpus !== spec.vcpus) {
      return yield* err("start", spec.vmId, `template ${name} is ${record.spec.memMib} MiB / ${record.spec.vcpus} vCPUs; the VM asks ${spec.memMib} MiB / ${spec.vcpus} vCPUs`)
    }
    const files = Templates.pathsOf(h.settings.stateDir, name)
    const mapped = record.method === "mapped"
    if (mapped && !h.settings.snapshots.ignoreShared) return yield* err("start", spec.vmId, `template ${name} is mapped and ${h.settings.snapshots.reason}`)
    let incoming = streamIncoming(h, spec.vmId, "the template's stream")
    if (mapped) {
      // Before the copy: the name below is the RAM file of a VM that may be resident.
      yield* h.ensureFree("start", spec.vmId)
      const own = h.ramPathFor(spec.vmId)
      yield* h.prepareRamDir(spec.vmId)
      const c0 = yield* nowMs
      yield* RamFile.sparseCopy(files.ram, own, { durable: false }).pipe(Effect.mapError((e) => err("start", spec.vmId, `template RAM file: ${e.message}`)))
      const used = yield* RamFile.allocatedBytes(own)
      incoming = { ram: { kind: "file", path: own, shared: true }, fresh: false, mapped: true, commit: Effect.void, undo: Effect.promise(() => rm(own, { force: true })), note: `the template's RAM file copied (${mib(used)} MiB used) in ${ms((yield* nowMs) - c0)} ms and mapped` }
    }
    const { vm, ready, parts } = yield* startFrom(h, spec, record.machine, files.state, incoming, "start", t0)
    const launch: Launch = {
      from: "template",
      method: record.method,
      template: name,
      readyMs: ready.readyMs,
      readiness: ready.readiness,
      detail: [`${record.method}: ${incoming.note}`, parts, ready.note].filter((x) => x !== "").join("; "),
    }
    return { ...vm.spec, status: vm.status, launch }
  })

/** The templates held, and removing one. */
export const listTemplates = (h: VmHost) => Templates.list(h.settings.stateDir)
export const removeTemplate = (h: VmHost, name: string) => (Templates.validName(name) ? Templates.remove(Templates.pathsOf(h.settings.stateDir, name)) : Effect.void)

/** Whether a VM id is a template build's (kept out of the runtime's list). */
export const isBuild = isInternal
