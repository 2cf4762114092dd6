/**
 * Two (or more) agents in one process with in-memory links and a fake coordinator: the
 * clock-driven fixture. Agents are built without their loops; tests drive reconcile passes.
 * The runtimes are `@engram/runtime`'s simulated ones on its in-memory wire.
 */
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { ImageStore, type Launch, type MigrateResult, SimRuntime, type VmRuntimeShape } from "@engram/runtime"
import { Effect, Ref } from "effect"
import { TestClock } from "effect/testing"
import { type Agent, makeAgent } from "../../src/Agent.js"
import { defaultAgentConfig } from "../../src/Host.js"
import { makeMoveTarget, type MoveTarget } from "../../src/MoveTarget.js"
import * as PeerLink from "../../src/PeerLink.js"
import { makeResidents, type Residents } from "../../src/Residents.js"
import { makeFakeCoordinator, type FakeCoordinator } from "./FakeCoordinator.js"

export interface TestHost {
  readonly hostId: string
  readonly agent: Agent
  readonly runtime: SimRuntime.SimRuntimeShape & { readonly starts: Ref.Ref<number>; readonly launches: Ref.Ref<readonly Launch[]> }
  readonly residents: Residents
  readonly target: MoveTarget
}

/**
 * Wraps a runtime to count starts (a guest booted again lost its memory) and keep how each VM
 * came to run, to run `onPause` when
 * a move has paused the guest at its post-capture check point (nothing sent yet), and
 * `onSwitchover` just before the final round is sent, and `onBeforePause` when the guard decided
 * to pause, the guest still running, before the caller's `beforePause` (its intent).
 */
const counting = (
  rt: SimRuntime.SimRuntimeShape,
  onPause: (vmId: string) => Effect.Effect<void>,
  onSwitchover: (vmId: string) => Effect.Effect<void>,
  onBeforePause: (vmId: string) => Effect.Effect<void>,
  selfConverge: boolean,
  intentFirst: ((vmId: string) => Effect.Effect<void>) | undefined,
) =>
  Effect.gen(function* () {
    const starts = yield* Ref.make(0)
    const launches = yield* Ref.make<readonly Launch[]>([])
    const migrate: VmRuntimeShape["migrate"] = (vmId, req) =>
      intentFirst !== undefined
        ? Effect.andThen(Effect.andThen(req.beforePause ?? Effect.void, intentFirst(vmId)), rt.migrate(vmId, { ...req, beforePause: undefined })).pipe(
            Effect.tap((r: MigrateResult) => (r._tag === "AtSwitchover" ? onPause(vmId) : Effect.void)),
          )
        : // `selfConverge`: as a hypervisor that paused on its own before the guard decided (QEMU converging by itself): `beforePause` is never called.
      rt.migrate(vmId, { ...req, beforePause: selfConverge ? undefined : Effect.andThen(onBeforePause(vmId), req.beforePause ?? Effect.void) }).pipe(
        Effect.tap((r: MigrateResult) => (r._tag === "AtSwitchover" ? onPause(vmId) : Effect.void)),
        Effect.map((r): MigrateResult => (r._tag === "AtSwitchover" ? { ...r, selfConverged: selfConverge, switchover: Effect.andThen(onSwitchover(vmId), r.switchover) } : r)),
      )
    return {
      ...rt,
      starts,
      launches,
      migrate,
      start: (...args: Parameters<VmRuntimeShape["start"]>) =>
        Ref.update(starts, (n) => n + 1).pipe(
          Effect.andThen(rt.start(...args)),
          Effect.tap((v) => Ref.update(launches, (l) => [...l, v.launch])),
        ),
    }
  })

export interface FleetOptions {
  /** Runs on a host when a move paused a VM there (e.g. the coordinator acting meanwhile). */
  readonly onPause?: (coordinator: FakeCoordinator, hostId: string, vmId: string) => Effect.Effect<void>
  /** Runs on a host when a move's guard decided to pause a VM there, the guest still running, before the agent records its intent. */
  readonly onBeforePause?: (coordinator: FakeCoordinator, hostId: string, vmId: string) => Effect.Effect<void>
  /** The runtime pauses on its own before its guard decides (as QEMU may): it never calls the agent's `beforePause`. */
  readonly selfConverge?: boolean
  /**
   * As QEMU: the caller's `beforePause` (its intent) is taken before the first round, then this
   * hook runs (the guest running, the intent held); the simulated migration follows.
   */
  readonly intentFirst?: (coordinator: FakeCoordinator, hostId: string, vmId: string) => Effect.Effect<void>
  /** Runs on a host just before a move's final round leaves it. */
  readonly onSwitchover?: (coordinator: FakeCoordinator, hostId: string, vmId: string) => Effect.Effect<void>
  /** Wraps the in-memory peer link (e.g. to watch it, or cut it). */
  readonly wrapLink?: (link: PeerLink.PeerLink, coordinator: FakeCoordinator) => PeerLink.PeerLink
  /** Runs on each write of a host's state file (e.g. to count them). */
  readonly onPersist?: (hostId: string) => Effect.Effect<void>
  /** The agents' `moveIntent` (`ENGRAM_AGENT_MOVE_INTENT`); these in-process tests default to on. */
  readonly moveIntent?: boolean
}

export const makeFleet = (hosts: readonly { readonly hostId: string; readonly sim?: Partial<SimRuntime.SimConfig> }[], options: FleetOptions = {}) =>
  Effect.gen(function* () {
    const coordinator: FakeCoordinator = yield* makeFakeCoordinator
    const targets = new Map<string, MoveTarget>()
    const plain = PeerLink.inMemory(targets)
    const link = options.wrapLink === undefined ? plain : options.wrapLink(plain, coordinator)
    const built: TestHost[] = []
    for (const h of hosts) {
      const hook = (f: FleetOptions["onPause"]) => (vmId: string) => (f === undefined ? Effect.void : f(coordinator, h.hostId, vmId))
      const runtime = yield* counting(yield* SimRuntime.make(h.sim), hook(options.onPause), hook(options.onSwitchover), hook(options.onBeforePause), options.selfConverge === true, options.intentFirst === undefined ? undefined : hook(options.intentFirst))
      const residents = yield* makeResidents(h.hostId, null, () => (options.onPersist === undefined ? Effect.void : options.onPersist(h.hostId)))
      const target = yield* makeMoveTarget(h.hostId, runtime, residents)
      targets.set(h.hostId, target)
      const agent = yield* makeAgent({ ...defaultAgentConfig(h.hostId), moveIntent: options.moveIntent ?? true }, {
        coordinator: coordinator.client(h.hostId),
        runtime,
        measure: () => Effect.succeed({ totalMib: 16384, allocatableMib: 15360, totalVcpus: 8 }),
        residents,
        images: ImageStore.directory(mkdtempSync(join(tmpdir(), `engram-images-${h.hostId}-`))),
        link,
        target,
      })
      built.push({ hostId: h.hostId, agent, runtime, residents, target })
    }
    /** One reconcile pass on every host from the coordinator's current view. */
    const pass = Effect.gen(function* () {
      for (const h of built) yield* h.agent.reconcile(yield* coordinator.assignmentsOf(h.hostId))
    })
    /**
     * Lets every host's actions finish on the TestClock: the clock moves a minute, then in
     * steps of a second while an action is still in flight (a descent or a restore does real
     * file I/O between its simulated durations, which the test clock cannot wait for). Bounded
     * in steps and in real time: the first steps give the I/O one turn of the event loop each,
     * the later ones 10 ms of real time, so a loaded machine's slow file I/O (a CI run at load 32
     * outlasted 2,000 turns) still finishes inside the bound, about 20 s.
     */
    const quiesce = Effect.gen(function* () {
      yield* TestClock.adjust("1 minute")
      for (let i = 0; i < 2000; i++) {
        let busy = false
        for (const h of built) busy = (yield* h.agent.busy) || busy
        if (!busy) return
        // The file I/O's turn (real time), then the clock for what follows it.
        yield* Effect.promise(() => new Promise<void>((resolve) => (i < 100 ? setImmediate(resolve) : setTimeout(resolve, 10))))
        yield* TestClock.adjust("1 second")
      }
      return yield* Effect.die(new Error("the agents' actions did not finish"))
    })
    return { coordinator, hosts: built, pass, quiesce }
  })
