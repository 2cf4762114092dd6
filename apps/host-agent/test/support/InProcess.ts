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
  readonly runtime: VmRuntimeShape & { readonly pauses: Ref.Ref<number> }
  readonly residents: Residents
  readonly target: MoveTarget
}

/** Wraps a runtime to count pauses (a refused move must not pause the guest). */
const countingPauses = (rt: VmRuntimeShape) =>
  Effect.map(Ref.make(0), (pauses) => ({ ...rt, pauses, pause: (id: string) => Ref.update(pauses, (n) => n + 1).pipe(Effect.andThen(rt.pause(id))) }))

export const makeFleet = (hosts: readonly { readonly hostId: string; readonly sim?: Partial<SimConfig> }[]) =>
  Effect.gen(function* () {
    const coordinator: FakeCoordinator = yield* makeFakeCoordinator
    const targets = new Map<string, MoveTarget>()
    const link = PeerLink.inMemory(targets)
    const built: TestHost[] = []
    for (const h of hosts) {
      const runtime = yield* countingPauses(yield* makeSimRuntime(h.sim))
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
