/**
 * Two (or more) agents in one process with in-memory links and a fake coordinator: the
 * clock-driven fixture. Agents are built without their loops; tests drive reconcile passes.
 */
import { Effect, Ref } from "effect"
import { type Agent, makeAgent } from "../../src/Agent.js"
import { defaultAgentConfig } from "../../src/Host.js"
import * as ImageStore from "../../src/ImageStore.js"
import { makeMoveTarget, type MoveTarget } from "../../src/MoveTarget.js"
import * as PeerLink from "../../src/PeerLink.js"
import { makeResidents, type Residents } from "../../src/Residents.js"
import type { VmRuntimeShape } from "../../src/Runtime.js"
import { makeSimRuntime, type SimConfig } from "../../src/SimRuntime.js"
import { makeFakeCoordinator, type FakeCoordinator } from "./FakeCoordinator.js"

export interface TestHost {
  readonly hostId: string
  readonly agent: Agent
  readonly runtime: VmRuntimeShape & { readonly pauses: Ref.Ref<number>; readonly starts: Ref.Ref<number> }
  readonly residents: Residents
  readonly target: MoveTarget
}

/**
 * Wraps a runtime to count pauses (a refused move must not pause the guest) and boots (a guest
 * booted again lost its memory), and to run `onPause` right after a pause.
 */
const counting = (rt: VmRuntimeShape, onPause: (vmId: string) => Effect.Effect<void>) =>
  Effect.gen(function* () {
    const pauses = yield* Ref.make(0)
    const starts = yield* Ref.make(0)
    return {
      ...rt,
      pauses,
      starts,
      pause: (id: string) => Ref.update(pauses, (n) => n + 1).pipe(Effect.andThen(rt.pause(id)), Effect.tap(() => onPause(id))),
      start: (spec: Parameters<VmRuntimeShape["start"]>[0]) => Ref.update(starts, (n) => n + 1).pipe(Effect.andThen(rt.start(spec))),
    }
  })

export interface FleetOptions {
  /** Runs on a host right after its runtime paused a VM (e.g. the coordinator acting meanwhile). */
  readonly onPause?: (coordinator: FakeCoordinator, hostId: string, vmId: string) => Effect.Effect<void>
  /** Wraps the in-memory peer link (e.g. to watch or delay what reaches a target). */
  readonly wrapLink?: (link: PeerLink.PeerLink, coordinator: FakeCoordinator) => PeerLink.PeerLink
}

export const makeFleet = (hosts: readonly { readonly hostId: string; readonly sim?: Partial<SimConfig> }[], options: FleetOptions = {}) =>
  Effect.gen(function* () {
    const coordinator: FakeCoordinator = yield* makeFakeCoordinator
    const targets = new Map<string, MoveTarget>()
    const plain = PeerLink.inMemory(targets)
    const link = options.wrapLink === undefined ? plain : options.wrapLink(plain, coordinator)
    const built: TestHost[] = []
    for (const h of hosts) {
      const onPause = options.onPause
      const runtime = yield* counting(yield* makeSimRuntime(h.sim), onPause === undefined ? () => Effect.void : (vmId) => onPause(coordinator, h.hostId, vmId))
      const residents = yield* makeResidents(h.hostId, null, () => Effect.void)
      const target = yield* makeMoveTarget(h.hostId, runtime, residents)
      targets.set(h.hostId, target)
      const agent = yield* makeAgent(defaultAgentConfig(h.hostId), {
        coordinator: coordinator.client(h.hostId),
        runtime,
        measure: () => Effect.succeed({ totalMib: 16384, allocatableMib: 15360, totalVcpus: 8 }),
        residents,
        images: yield* ImageStore.inMemory(),
        link,
        target,
      })
      built.push({ hostId: h.hostId, agent, runtime, residents, target })
    }
    /** One reconcile pass on every host from the coordinator's current view. */
    const pass = Effect.gen(function* () {
      for (const h of built) yield* h.agent.reconcile(yield* coordinator.assignmentsOf(h.hostId))
    })
    return { coordinator, hosts: built, pass }
  })
