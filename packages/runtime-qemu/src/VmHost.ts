/**
 * The VMs of one QEMU runtime and what every operation on them uses: the table of resident VMs,
 * spawning a VM's QEMU and connecting to it (`launch`), ending it and removing its files
 * (`finish`), dropping a VM whose QEMU ended by itself (crashed or killed), reconnecting a
 * monitor whose connection closed while QEMU lives (`watchEnd`), QMP calls with their
 * errors as `RuntimeError`s, the end of a migration, and the guest's readiness (SPEC §13: a VM
 * runs once its guest says so on its console).
 */
import { mkdir, rm } from "node:fs/promises"
import { dirname, join } from "node:path"
import { Deferred, Effect, Exit, type Fiber, Option, PubSub, Schedule, Scope } from "effect"
import { type IncomingEndpoint, nowMs, pathSegment, RuntimeError, type VmSpec, type VmStatus } from "@engram/runtime"
import * as Monitor from "./Monitor.js"
import * as Qmp from "./Qmp.js"
import type * as M from "./QemuMigration.js"
import * as P from "./QemuProcess.js"
import type * as RamFile from "./RamFile.js"
import * as Readiness from "./Readiness.js"

/** A resident VM. */
export interface Vm {
  readonly spec: VmSpec
  readonly paths: P.VmPaths
  readonly pid: number
  /** Its QMP monitor, reconnected when its connection closes while QEMU lives (`Monitor`). */
  readonly client: Monitor.Monitor
  /** The VM's own (its monitor's end, the fibers that follow it); closed when the VM ends or the runtime lets it go. */
  readonly scope: Scope.Closeable
  record: P.VmRecord
  status: VmStatus
  endpoint: IncomingEndpoint | null
  /** Its QEMU's end, when this agent spawned it; null for a QEMU adopted after a restart (no child of this agent). */
  readonly exited: Effect.Effect<P.ProcessEnd> | null
}

/** A live QEMU of a VM whose monitor has not answered since a restart (see `VmHost.attaching`). */
export interface Attaching {
  readonly spec: VmSpec
  readonly paths: P.VmPaths
  readonly pid: number
  readonly record: P.VmRecord
  /** As the agent last knew it (`recover`'s `known`); `paused` when it did not know the VM. */
  readonly status: VmStatus
  /** The background attach, ended by `destroy`. */
  fiber: Fiber.Fiber<void> | null
}

/** How long a migration may go on (`VmHost.awaitMigrationEnd`). */
export type MigrationBound = { readonly kind: "progress"; readonly ms: number; readonly measure: "sent" | "loaded" } | { readonly kind: "total"; readonly ms: number }

/** Whether a migration status is one of a migration still running (QEMU's `MigrationStatus`). */
export const migrating = (status: string | undefined): boolean => ["setup", "active", "pre-switchover", "device", "cancelling", "wait-unplug"].includes(status ?? "")

/** How a runtime captures guests: mapped (RAM files, `x-ignore-shared`) or stream, and why. */
export interface Snapshots {
  readonly method: "mapped" | "stream"
  readonly reason: string
  /** Whether this QEMU knows `x-ignore-shared` (4.0 and later): a mapped image or template can be loaded. */
  readonly ignoreShared: boolean
}

/** A first QMP connection of a VM and where its events go (`VmHost.attach`). */
export interface Attached extends Monitor.Connection {
  readonly events: PubSub.PubSub<Qmp.QmpEvent>
}

/** What the host needs of the runtime's settings. */
export interface HostSettings {
  readonly stateDir: string
  readonly binary: string
  readonly qmpTimeoutMs: number
  readonly startTimeoutMs: number
  readonly migrationTimeoutMs: number
  readonly tcgTbSizeMib: number
  readonly extraArgs: readonly string[]
  readonly snapshots: Snapshots
  /** Where RAM files live; undefined: each VM's own directory. */
  readonly ramDir: string | undefined
  readonly readyLine: RegExp | undefined
  readonly bootReadyTimeoutMs: number
  readonly resumeReadyTimeoutMs: number
  /** Test seams: `QemuConfig.testHooks`. */
  readonly testHooks: TestHooks | undefined
}

/**
 * Points where a test stands a restore or template start still, to cut it short as a crash
 * would (interrupting it there skips every undo): `launched` (QEMU waits for the state),
 * `loaded` (the state is in, the guest has not run, a mapped restore has not committed).
 */
export interface TestHooks {
  readonly startFrom?: (vmId: string, stage: "launched" | "loaded") => Effect.Effect<void>
  /** How a descent reads its QEMU's `/proc/<pid>/maps` (a test stands it still, as a QEMU stuck in the kernel does). */
  readonly readMaps?: P.ReadText
}

/** How a guest came to be ready. */
export interface Ready {
  readonly readiness: "guest" | "process"
  readonly readyMs: number
  /** Empty when the guest said it; else why not. */
  readonly note: string
}

export const err = (op: string, vmId: string, message: string) => new RuntimeError({ op, vmId, message })
export const asRuntimeError = (op: string, vmId: string) => (e: { readonly message: string; readonly _tag: string }) => err(op, vmId, `${e._tag}: ${e.message}`)

/** VM ids of the runtime's own guests (template builds): `@` is no character of a session id. */
export const isInternal = (vmId: string): boolean => vmId.startsWith("@")

/** The host's VM table and primitives; QMP connections live in the scope (the VMs outlive it). */
export const make = (s: HostSettings) =>
  Effect.gen(function* () {
    const vms = new Map<string, Vm>()
    const hostScope = yield* Effect.scope
    yield* Effect.addFinalizer(() => Effect.forEach([...vms.values()], (vm) => Scope.close(vm.scope, Exit.void), { discard: true }))

    /** The resident VM `vmId`, looked up when run (an attaching VM's monitor may answer by then). */
    const get = (op: string, vmId: string) =>
      Effect.suspend(() => {
        const vm = vms.get(vmId)
        if (vm !== undefined) return Effect.succeed(vm)
        const pending = attaching.get(vmId)
        return Effect.fail(pending === undefined ? err(op, vmId, `no VM ${vmId} on this host`) : unanswered(op, vmId, pending.pid))
      })
    const q = <A = unknown>(vm: Vm, op: string, command: string, args?: Readonly<Record<string, unknown>>, timeoutMs = s.qmpTimeoutMs) =>
      vm.client.execute<A>(command, args, timeoutMs).pipe(Effect.mapError(asRuntimeError(op, vm.spec.vmId)))
    const queryMigrate = (vm: Vm, op: string) => q<M.MigrationInfo>(vm, op, "query-migrate")
    const runStatus = (vm: Vm, op: string) =>
      Effect.map(q<{ status: string; running: boolean }>(vm, op, "query-status"), (st): VmStatus => (st.running ? "running" : "paused"))

    /** Where the RAM file of `vmId` lives. */
    const ramPathFor = (vmId: string) => (s.ramDir === undefined ? P.pathsOf(s.stateDir, vmId).ram : join(s.ramDir, `${pathSegment(vmId)}.ram`))
    /** A new VM's RAM: a new file it owns (mapped snapshots), or QEMU's own memory. */
    const freshRam = (vmId: string): RamFile.RamBacking =>
      s.snapshots.method === "mapped" ? { kind: "file", path: ramPathFor(vmId), shared: true } : { kind: "anonymous" }
    /** A VM owns its RAM file when it writes it (shared); a private mapping's file is its image's. */
    const ownedRam = (ram: RamFile.RamBacking | undefined): string | null => (ram?.kind === "file" && ram.shared ? ram.path : null)
    const prepareRamDir = (vmId: string) => Effect.promise(() => mkdir(dirname(ramPathFor(vmId)), { recursive: true }))

    /**
     * Registers a resident VM and follows its guest's STOP and RESUME events into `vm.status`, for
     * as long as it is held (in its scope, across its monitor's reconnects): the status QEMU last
     * said, also after a command that timed out ran late (a `stop` answered after its timeout
     * leaves the guest paused); and its `MIGRATION` events, the migration status last heard. And
     * watches its monitor and its QEMU's end (`watchEnd`).
     */
    const hold = (vm: Vm) =>
      Effect.gen(function* () {
        vms.set(vm.spec.vmId, vm)
        let migration: string | null = null
        const follow = Effect.scoped(
          Effect.gen(function* () {
            const sub = yield* vm.client.subscribe
            for (;;) {
              const e = yield* PubSub.take(sub)
              if (e.event === "STOP") vm.status = "paused"
              else if (e.event === "RESUME") vm.status = "running"
              else if (e.event === "MIGRATION") migration = String(e.data["status"])
            }
          }),
        )
        yield* Effect.forkIn(follow, vm.scope)
        // In the host's scope: the drop closes the VM's scope, and must not cut itself short.
        yield* Effect.forkIn(watchEnd(vm, () => migration), hostScope)
      })

    /**
     * The end of each VM this runtime took in hand: its own `finish`, or a drop after its QEMU
     * ended by itself. Once per VM: a second finish waits for the first (true: it ended whole; false:
     * it was interrupted, and the second does it again), and a drop never follows a finish.
     */
    const endings = new WeakMap<Vm, Deferred.Deferred<boolean>>()
    const endOnce = (vm: Vm, end: Effect.Effect<void>): Effect.Effect<void> =>
      Effect.suspend(() => {
        const under = endings.get(vm)
        if (under !== undefined) return Effect.flatMap(Deferred.await(under), (whole) => (whole ? Effect.void : endOnce(vm, end)))
        const done = Deferred.makeUnsafe<boolean>()
        endings.set(vm, done)
        return end.pipe(
          Effect.onExit((exit) =>
            Effect.suspend(() => {
              if (!Exit.isSuccess(exit)) endings.delete(vm)
              return Deferred.succeed(done, Exit.isSuccess(exit))
            }),
          ),
        )
      })

    /** How long QEMU's end is waited for once its monitor's connection closed (a QEMU that ends closes it a moment before it is gone). */
    const endGraceMs = 250
    /** Pauses between reconnect tries: 50 ms, doubling, at most 1 s (a QEMU that ends meanwhile is noticed within it). */
    const reconnectPauses = Schedule.min([Schedule.exponential("50 millis"), Schedule.spaced("1 second")])

    /** Whether a VM's QEMU is gone, waiting `graceMs` at most for its end (a child's exit, or its pid polled). */
    const goneWithin = (vm: Vm, graceMs: number) =>
      Effect.gen(function* () {
        if (vm.exited !== null) yield* vm.exited.pipe(Effect.timeoutOption(graceMs))
        else yield* P.awaitExit(vm.pid, graceMs)
        return !(yield* P.aliveAs(vm.pid, s.binary, vm.paths.pidFile))
      })

    /**
     * Watches a held VM's monitor and its QEMU's end. QEMU's monitor connection closes when QEMU
     * ends, when this runtime closes it (`finish`, or the runtime's own end), and when the
     * connection fails while QEMU lives (a socket hiccup, a chardev reset, a read error): then the
     * VM stays and its QMP socket is connected again (`reconnect`) until it answers or its QEMU is
     * gone. A QEMU that ended is dropped (`dropEnded`), once. A pid taken by another process is no
     * QEMU of this VM (`aliveAs`).
     */
    const watchEnd = (vm: Vm, heardMigration: () => string | null) =>
      Effect.gen(function* () {
        const ours = () => !endings.has(vm) && vms.get(vm.spec.vmId) === vm
        const about = { vmId: vm.spec.vmId, pid: vm.pid, socket: vm.paths.socket }
        for (;;) {
          yield* vm.client.closed
          if (!ours()) return
          if (yield* goneWithin(vm, endGraceMs)) break
          if (!ours()) return
          yield* vm.client.lost
          const lostAtMs = yield* nowMs
          // QEMU's event timestamps are the host's realtime clock, not Effect's.
          const lostAtQemuMs = Date.now()
          yield* Effect.logWarning("QEMU VM's monitor connection closed while its QEMU runs; reconnecting to its QMP socket (a command meanwhile waits for it within its own timeout)", about)
          const { outcome, tries } = yield* reconnect(vm, ours)
          if (outcome === "theirs") return
          if (outcome === "gone") break
          const migration = yield* retell(vm, heardMigration, lostAtMs, lostAtQemuMs)
          yield* Effect.logInfo("QEMU VM's monitor is back: reconnected, capabilities negotiated", {
            ...about,
            tries,
            lostMs: (yield* nowMs) - lostAtMs,
            status: vm.status,
            ...(migration === undefined ? {} : { migration }),
          })
        }
        if (!ours()) return
        // A child's end comes with its exit status, once reaped (at once, as a rule).
        const end = vm.exited === null ? Option.none() : yield* vm.exited.pipe(Effect.timeoutOption(1000))
        yield* dropEnded(vm, Option.getOrNull(end))
      })

    /**
     * After a reconnect, what QEMU said while no connection was up, which went to no one, said
     * again as QEMU would have said it, to whoever waits on the VM's events: its run status read
     * again (a STOP or RESUME missed is published), and, when a migration was in flight (the last
     * `MIGRATION` status heard is one of a migration running), its status read again
     * (`query-migrate`) and published as its `MIGRATION` event unless it is the one last heard:
     * `completed`, `failed` (its waiter reads QEMU's `error-desc`), `cancelled`, `pre-switchover`,
     * …; still `active`, nothing is said and its waiter goes on waiting. An event that came on the
     * new connection before the reading was heard, and is not said twice. A missed STOP is stamped
     * at the loss (the earliest the guest can have stopped unseen), a missed RESUME or migration
     * status at its reading (the latest): a move's pause and capture are counted long, never
     * short. QEMU's migration capabilities and parameters are its own, not the connection's:
     * nothing is set again. Answers the migration status read (undefined: none was in flight, or
     * QEMU did not answer).
     */
    const retell = (vm: Vm, heardMigration: () => string | null, lostAtMs: number, lostAtQemuMs: number) =>
      Effect.gen(function* () {
        const say = (event: string, data: Record<string, unknown>, receivedAtMs: number, qemuAtMs: number) =>
          PubSub.publish(vm.client.events, { event, data, receivedAtMs, qemuAtMs } satisfies Qmp.QmpEvent)
        const before = vm.status
        const status = yield* runStatus(vm, "reconnect").pipe(Effect.option)
        if (Option.isSome(status) && status.value !== before) {
          vm.status = status.value
          if (status.value === "paused") yield* say("STOP", {}, lostAtMs, lostAtQemuMs)
          else yield* say("RESUME", {}, yield* nowMs, Date.now())
        }
        if (!migrating(heardMigration() ?? undefined)) return undefined
        const info = yield* queryMigrate(vm, "reconnect").pipe(Effect.option)
        const now = Option.isSome(info) ? info.value.status : undefined
        // Heard again after the reading: an event of the new connection is heard before its answer.
        const heard = heardMigration()
        if (now !== undefined && now !== heard && migrating(heard ?? undefined)) yield* say("MIGRATION", { status: now }, yield* nowMs, Date.now())
        return now
      })

    /**
     * Connects a held VM's monitor again, pausing between tries (`reconnectPauses`), each try
     * bounded by `qmpTimeoutMs`, for as long as its QEMU lives. Answers `back` (swapped in),
     * `gone` (its QEMU ended) or `theirs` (the runtime ended the VM meanwhile: nothing swapped in).
     */
    const reconnect = (vm: Vm, ours: () => boolean) =>
      Effect.gen(function* () {
        let tries = 0
        const attempt = Effect.gen(function* () {
          if (!ours()) return "theirs" as const
          if (!(yield* P.aliveAs(vm.pid, s.binary, vm.paths.pidFile))) return "gone" as const
          tries += 1
          // The swap uninterrupted once connected: a connection left open would be the one QEMU serves.
          return yield* Effect.uninterruptibleMask((restore) =>
            Effect.flatMap(restore(connectOnce(vm.paths, vm.client.events, s.qmpTimeoutMs, s.qmpTimeoutMs)), (conn) =>
              ours() ? Effect.map(vm.client.reconnected(conn), (swapped) => (swapped ? ("back" as const) : ("theirs" as const))) : Effect.as(Scope.close(conn.scope, Exit.void), "theirs" as const),
            ),
          )
        })
        const outcome = yield* Effect.raceFirst(attempt.pipe(Effect.retry(reconnectPauses)), Effect.as(vm.client.ended, "theirs" as const))
        return { outcome, tries }
      })

    /**
     * Drops a VM whose QEMU ended by itself (crashed, killed, or an incoming state that failed to
     * load): logged, its connection closed and its files removed as `finish` does, then gone from
     * the table, so that a start of the VM finds nothing of it left. Nothing is killed: its QEMU is
     * gone. Not after a finish of the VM (an end this runtime asked for is no crash).
     */
    const dropEnded = (vm: Vm, end: P.ProcessEnd | null) =>
      Effect.suspend(() => {
        if (endings.has(vm) || vms.get(vm.spec.vmId) !== vm) return Effect.void
        return endOnce(
          vm,
          Effect.uninterruptible(
            Effect.gen(function* () {
              // An incoming VM of a move ends by itself when its stream is cancelled, fails or does
              // not load: the guest runs on at its source, nothing is lost (a warning, not an error).
              const incoming = vm.record.incomingMoveId !== null
              const say = incoming ? Effect.logWarning : Effect.logError
              const stderr = yield* P.stderrTail(vm.paths)
              yield* say(
                incoming
                  ? "QEMU of a move's incoming VM ended (its stream was cancelled, failed or did not load): the guest runs on at its source; the VM leaves the list and its files are removed"
                  : "QEMU VM ended by itself (not by this runtime): its guest is lost; the VM leaves the list and its files are removed",
                {
                  vmId: vm.spec.vmId,
                  pid: vm.pid,
                  ended: vm.exited === null ? `${P.describeEnd(end)} (adopted after a restart: no child of this agent)` : P.describeEnd(end),
                  ...(end === null ? {} : { exitCode: end.code, signal: end.signal }),
                  ...(vm.record.incomingMoveId === null ? {} : { incomingMoveId: vm.record.incomingMoveId }),
                  ...(stderr === "" ? {} : { stderr }),
                },
              )
              yield* Scope.close(vm.scope, Exit.void)
              yield* removeFiles(vm.paths, vm.record.ram)
              if (vms.get(vm.spec.vmId) === vm) vms.delete(vm.spec.vmId)
            }),
          ),
        )
      })

    /** VMs whose QEMU is being spawned (one launch per VM at a time). */
    const launching = new Set<string>()

    /**
     * One connection to a VM's QMP socket, negotiated, its events into `events`; within `leftMs`
     * (on Effect's Clock; `boundMs` is the bound the error names). Its scope is closed when it
     * fails: QEMU serves one monitor client at a time, and a try left open would be the one it greets.
     */
    const connectOnce = (paths: P.VmPaths, events: PubSub.PubSub<Qmp.QmpEvent>, leftMs: number, boundMs: number) =>
      Effect.gen(function* () {
        const scope = yield* Scope.make()
        const client = yield* Qmp.connect(paths.socket, { timeoutMs: s.qmpTimeoutMs, events }).pipe(
          Scope.provide(scope),
          Effect.timeoutOrElse({ duration: Math.max(1, Math.ceil(leftMs)), orElse: () => Effect.fail(new Qmp.QmpTimeout({ socket: paths.socket, command: "connect", timeoutMs: boundMs, message: `no QMP greeting within ${boundMs} ms` })) }),
          Effect.onError(() => Scope.close(scope, Exit.void)),
        )
        return { client, scope } satisfies Monitor.Connection
      })

    /**
     * Connects to a VM's QMP socket, retrying while its process lives, within `timeoutMs` of
     * elapsed time (on Effect's Clock), one try at a time (`connectOnce`).
     */
    const attach = (paths: P.VmPaths, pid: number, vmId: string, timeoutMs: number) =>
      Effect.gen(function* () {
        const deadline = (yield* nowMs) + timeoutMs
        const events = yield* PubSub.unbounded<Qmp.QmpEvent>()
        for (;;) {
          const tried = P.alive(pid) ? yield* Effect.result(connectOnce(paths, events, deadline - (yield* nowMs), timeoutMs)) : null
          if (tried?._tag === "Success") return { ...tried.success, events } satisfies Attached
          const why = tried === null ? "QEMU exited" : tried.failure.message
          if (tried === null || (yield* nowMs) + 25 >= deadline) {
            const stderr = yield* P.stderrTail(paths)
            return yield* err("attach", vmId, `QMP at ${paths.socket}: ${why}${stderr === "" ? "" : ` (qemu: ${stderr})`}`)
          }
          yield* Effect.sleep(25)
        }
      })

    /** A VM's monitor on its first connection, and the VM's scope, whose close ends the monitor. */
    const monitorOf = (attached: Attached) =>
      Effect.gen(function* () {
        const scope = yield* Scope.make()
        const client = Monitor.make(attached, attached.events, s.qmpTimeoutMs)
        yield* Scope.addFinalizer(scope, client.end("no monitor: the VM was ended, or this runtime let it go"))
        return { client, scope }
      })

    /**
     * Live QEMUs of this runtime's VMs whose monitor did not answer yet (found at recovery): each
     * a guest, listed and measured, tried again in the background, never started afresh.
     */
    const attaching = new Map<string, Attaching>()
    const unanswered = (op: string, vmId: string, pid: number) => err(op, vmId, `a QEMU for this VM is running (pid ${pid}) but its monitor does not answer yet: it is kept, and attached once it answers`)

    /**
     * Fails unless `vmId` is free for a new QEMU: none resident, starting or attaching, and no live
     * QEMU of a VM in its files (one this runtime does not hold: a guest, not ended here; `destroy`
     * ends it). A live QEMU without the VM's record never became a VM (its launch was cut short
     * before the record was written: nothing of a guest ran on it) and is ended. Checked before a
     * start touches any of the VM's files (its RAM file is the guest's RAM).
     */
    const ensureFree = (op: string, vmId: string) =>
      Effect.gen(function* () {
        if (vms.has(vmId) || launching.has(vmId)) return yield* err(op, vmId, "VM already resident")
        const pending = attaching.get(vmId)
        if (pending !== undefined) return yield* unanswered(op, vmId, pending.pid)
        const paths = P.pathsOf(s.stateDir, vmId)
        const stray = yield* P.readPidOrFail(paths, op, vmId)
        if (stray === undefined || !(yield* P.aliveAs(stray, s.binary, paths.pidFile))) return
        if ((yield* P.readRecord(paths.record)) !== undefined) {
          return yield* err(op, vmId, `a QEMU for this VM is running (pid ${stray}) that this runtime does not hold: it is not replaced (destroy ends it)`)
        }
        yield* Effect.logWarning("a QEMU whose launch was cut short before its VM's record was written runs in the VM's files; it is ended before a new one starts", { vmId, pid: stray })
        yield* P.kill(stray, 5000)
      })

    /**
     * Spawns a VM's QEMU on `ram` and connects to it. Not interruptible: a QEMU spawned and never
     * registered would run on unseen. Refused while a live QEMU runs in the VM's files (held,
     * attaching, or one this runtime does not hold): one QEMU per VM, and a live one is a guest,
     * never ended to make room. A new RAM file (`fresh`) starts empty: a stale one of an earlier
     * VM is removed.
     */
    const launch = (
      spec: VmSpec,
      m: P.Machine,
      o: { readonly incomingMoveId: string | null; readonly incoming: boolean; readonly ram: RamFile.RamBacking; readonly fresh: boolean; readonly ramOrigin?: string },
    ) =>
      Effect.uninterruptible(
        Effect.gen(function* () {
          yield* ensureFree("start", spec.vmId)
          launching.add(spec.vmId)
          return yield* Effect.gen(function* () {
            const paths = P.pathsOf(s.stateDir, spec.vmId)
            if (o.fresh && o.ram.kind === "file") {
              yield* prepareRamDir(spec.vmId)
              yield* Effect.promise(() => rm(o.ram.kind === "file" ? o.ram.path : "", { force: true }))
            }
            const args = P.argv(spec, m, paths, { incoming: o.incoming, tcgTbSizeMib: s.tcgTbSizeMib, extra: s.extraArgs, ram: o.ram })
            const { pid, exited } = yield* P.spawnQemu(s.binary, args, paths, spec.vmId)
            const attached = yield* attach(paths, pid, spec.vmId, s.startTimeoutMs).pipe(Effect.tapError(() => P.kill(pid, 2000)))
            const record: P.VmRecord = { engram: "qemu-vm/v1", spec, machine: m, socket: paths.socket, incomingMoveId: o.incomingMoveId, ram: o.ram, ...(o.ramOrigin === undefined ? {} : { ramOrigin: o.ramOrigin }) }
            yield* P.writeRecord(paths, record).pipe(Effect.tapError(() => P.kill(pid, 2000)))
            const vm: Vm = { spec, paths, pid, ...(yield* monitorOf(attached)), record, status: o.incoming ? "paused" : "running", endpoint: null, exited }
            yield* hold(vm)
            return vm
          }).pipe(Effect.ensuring(Effect.sync(() => launching.delete(spec.vmId))))
        }),
      )

    /**
     * Ends a VM's QEMU (`quit`, then signals; signals at once while its monitor is being
     * reconnected) and removes its files, its RAM file with them when it
     * owns it. Once per VM: after a drop (its QEMU ended by itself) or another finish, it waits for
     * that one. Never fails.
     */
    const finish = (vm: Vm) =>
      endOnce(
        vm,
        Effect.gen(function* () {
          // Only this VM's entry: a VM of the same id started since is another's.
          if (vms.get(vm.spec.vmId) === vm) vms.delete(vm.spec.vmId)
          // A monitor being reconnected is not waited for: QEMU ends on SIGTERM as on `quit`.
          const asked = yield* vm.client.connected
          if (asked) yield* vm.client.execute("quit", undefined, 5000).pipe(Effect.ignore)
          if (!asked || !(yield* P.awaitExit(vm.pid, 10_000))) yield* P.kill(vm.pid, 5000)
          yield* Scope.close(vm.scope, Exit.void)
          yield* removeFiles(vm.paths, vm.record.ram)
        }),
      )

    /** Removes a VM's directory, socket and owned RAM file. */
    const removeFiles = (paths: P.VmPaths, ram: RamFile.RamBacking | undefined) =>
      Effect.promise(() =>
        Promise.all([rm(paths.dir, { recursive: true, force: true }), rm(paths.socket, { force: true }), ...[ownedRam(ram)].filter((f) => f !== null).map((f) => rm(f, { force: true }))]),
      ).pipe(Effect.asVoid)

    /**
     * Waits for the end of a migration (either side): `completed`, or a failure as an error.
     * Bounded by `bound`: `progress`, until nothing moved for `ms` (`sent`: QEMU's
     * `ram.transferred` on the sending side; `loaded`: the resident memory of an incoming QEMU,
     * which shows nothing else of its load), read at each migration event and every `ms / 4` (at
     * most 1 s) between them; `total`, `ms` in all (a paused guest's final round). Default: no
     * progress for `migrationTimeoutMs`.
     */
    const awaitMigrationEnd = (vm: Vm, op: string, sub: PubSub.Subscription<Qmp.QmpEvent>, bound: MigrationBound = { kind: "progress", ms: s.migrationTimeoutMs, measure: "sent" }) =>
      Effect.gen(function* () {
        const t0 = yield* nowMs
        const pollMs = Math.max(10, Math.min(1000, bound.ms / 4))
        let movedAtMs = t0
        let moved = -1
        const progress = Effect.gen(function* () {
          if (bound.kind !== "progress") return
          // An unanswered query is no progress (a monitor held by the save, say).
          const now = bound.measure === "sent" ? ((yield* queryMigrate(vm, op).pipe(Effect.orElseSucceed((): M.MigrationInfo => ({})))).ram?.transferred ?? 0) : (P.rssBytes(vm.pid) ?? 0)
          if (now > moved) {
            moved = now
            movedAtMs = yield* nowMs
          }
        })
        yield* progress
        let end: Qmp.QmpEvent | undefined
        while (end === undefined) {
          const leftMs = (bound.kind === "total" ? t0 : movedAtMs) + bound.ms - (yield* nowMs)
          if (leftMs <= 0) {
            const why = bound.kind === "total" ? `not ended within ${bound.ms} ms` : `nothing ${bound.measure === "sent" ? "sent" : "loaded"} for ${bound.ms} ms (${moved} bytes ${bound.measure === "sent" ? "sent" : "resident"})`
            return yield* err(op, vm.spec.vmId, `migration ${why}`)
          }
          const e = yield* PubSub.take(sub).pipe(Effect.timeoutOption(Math.max(1, Math.min(pollMs, leftMs))))
          if (Option.isSome(e) && ((e.value.event === "MIGRATION" && ["completed", "failed", "cancelled"].includes(String(e.value.data["status"]))) || e.value.event === "SHUTDOWN")) end = e.value
          else if (Option.isNone(e) || e.value.event === "MIGRATION_PASS" || e.value.event === "MIGRATION") yield* progress
        }
        if (end.event === "MIGRATION" && end.data["status"] === "completed") return end
        const info = yield* queryMigrate(vm, op).pipe(Effect.orElseSucceed((): M.MigrationInfo => ({})))
        return yield* err(op, vm.spec.vmId, `migration ${end.event === "SHUTDOWN" ? "ended by a QEMU shutdown" : String(end.data["status"])}${info["error-desc"] === undefined ? "" : `: ${info["error-desc"]}`}`)
      })

    /**
     * Cancels a VM's outgoing migration if one runs and waits (10 s at most) until QEMU says it
     * ended; a cancel at pre-switchover resumes a guest that ran. Answers the migration's last
     * status (`none`: none ran), or null when unknown (QEMU did not answer, or said nothing of
     * its end within 10 s). Never fails.
     */
    const cancelMigration = (vm: Vm, op: string) =>
      Effect.scoped(
        Effect.gen(function* () {
          const sub = yield* vm.client.subscribe
          // Unanswered, the cancel is sent all the same (a cancel of no migration is a no-op):
          // a monitor held by the migration's last phase reads it once free.
          const before = yield* queryMigrate(vm, op).pipe(Effect.option)
          if (Option.isSome(before) && !migrating(before.value.status)) return before.value.status ?? "none"
          yield* q(vm, op, "migrate_cancel")
          const ended = yield* Qmp.awaitEvent(sub, (e) => (e.event === "MIGRATION" && !migrating(String(e.data["status"])) ? String(e.data["status"]) : undefined), 10_000, "cancelled")
          return ended
        }),
      ).pipe(Effect.orElseSucceed(() => null))

    /**
     * Takes a guest out of QEMU's `postmigrate` before a new migration of it (a move's stream or a
     * descent's save) and answers its run status then. A stream of a guest that was stopped when
     * it began, cancelled or failed once QEMU had stopped it for the final round (and one that
     * completed), leaves the guest there, not `paused`, and QEMU 7.2 refuses to migrate it from
     * there ("Can't migrate the vm that was paused due to previous migration"). Only `cont`
     * leaves that state: the guest runs for one monitor round trip and is stopped again. A `stop`
     * that fails is sent once more; if that fails too, this fails saying so, and the VM's status
     * is what QEMU then says, `running` when it does not answer (the guest was resumed): never
     * claimed paused while it may run.
     */
    const leavePostmigrate = (vm: Vm, op: string) =>
      Effect.gen(function* () {
        const st = yield* q<{ status: string; running: boolean }>(vm, op, "query-status")
        if (st.status !== "postmigrate") return st
        const left = yield* q(vm, op, "cont").pipe(Effect.andThen(q(vm, op, "stop").pipe(Effect.retry({ times: 1 }))), Effect.result)
        if (left._tag === "Success") return { status: "paused", running: false }
        const now = yield* q<{ status: string; running: boolean }>(vm, op, "query-status").pipe(Effect.option)
        // The stop ran after all (answered too late, say): the guest is paused, out of postmigrate.
        if (Option.isSome(now) && now.value.status === "paused") return now.value
        const running = Option.isNone(now) || now.value.running
        vm.status = running ? "running" : "paused"
        return yield* err(
          op,
          vm.spec.vmId,
          `its guest could not be taken out of QEMU's postmigrate (left by an earlier migration; QEMU migrates no guest from there): ${left.failure.message}; ${
            running ? `it was resumed (cont) and not stopped again: it ${Option.isNone(now) ? "may run (QEMU does not answer)" : "runs"} here` : `it is still ${now.value.status}`
          }`,
        )
      })

    /**
     * Waits for the guest to say it is ready: its console line after `from` (a boot: 0; a
     * resume: its tail started before `cont`), timed from `t0`. Without a configured line, or a
     * resumed guest that does not say it in time, the VM counts as ready when QEMU runs it (the
     * note says which); a booted guest that never says it fails.
     */
    const awaitReady = (vm: Vm, op: string, kind: "boot" | "resume", from: number | Readiness.ConsoleTail, t0: number) =>
      Effect.gen(function* () {
        if (s.readyLine === undefined) return { readiness: "process", readyMs: (yield* nowMs) - t0, note: "no guest readiness line configured" } satisfies Ready
        const timeoutMs = kind === "boot" ? s.bootReadyTimeoutMs : s.resumeReadyTimeoutMs
        const seen = yield* Readiness.awaitLine(vm.paths.console, from, s.readyLine, timeoutMs, () => P.alive(vm.pid))
        const readyMs = (yield* nowMs) - t0
        if (seen === "seen") return { readiness: "guest", readyMs, note: "" } satisfies Ready
        const why = seen === "exited" ? "its QEMU exited" : `no console line matching ${String(s.readyLine)} within ${timeoutMs} ms`
        if (kind === "boot") {
          const stderr = yield* P.stderrTail(vm.paths)
          return yield* err(op, vm.spec.vmId, `the guest did not say it is ready: ${why}${stderr === "" ? "" : ` (qemu: ${stderr})`}`)
        }
        return { readiness: "process", readyMs, note: `the guest did not say it is ready (${why}); running as far as QEMU knows` } satisfies Ready
      })

    /** Resumes a paused VM and waits for its guest's next readiness line. */
    const resume = (vm: Vm, op: string, t0: number) =>
      Effect.gen(function* () {
        // Started before `cont`: the console's size looked up before the guest runs, even when that read stalls.
        const tail = yield* Readiness.tailFromEnd(vm.paths.console)
        yield* q(vm, op, "cont")
        vm.status = "running"
        return yield* awaitReady(vm, op, "resume", tail, t0)
      })

    return { settings: s, vms, hold, attaching, ensureFree, get, q, queryMigrate, runStatus, ramPathFor, freshRam, ownedRam, prepareRamDir, attach, monitorOf, launch, finish, removeFiles, awaitMigrationEnd, cancelMigration, leavePostmigrate, awaitReady, resume }
  })

/** The host of one runtime. */
export type VmHost = Effect.Success<ReturnType<typeof make>>
