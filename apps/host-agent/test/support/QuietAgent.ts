import type { VmRuntimeShape } from "@engram/runtime"
import { Effect } from "effect"
import { makeAgent } from "../../src/Agent.js"
import type { CoordinatorShape } from "../../src/Coordinator.js"
import { defaultAgentConfig } from "../../src/Host.js"
import type { HostReport } from "../../src/Measure.js"
import { makeMoveTarget } from "../../src/MoveTarget.js"
import type { MoveTarget } from "../../src/MoveTarget.js"
import * as PeerLink from "../../src/PeerLink.js"
import { makeResidents } from "../../src/Residents.js"
import type { Residents } from "../../src/Residents.js"
import { noImages } from "./PatientClock.js"

/**
 * Host a's agent on `coordinator` and `runtime` with no image I/O (`noImages`) and in-memory peer
 * links (to no target unless `link` is given): every step is one the TestClock tracks, so a test's
 * order is the same on any machine. Its residents and move target are made here unless given.
 */
export const quietAgent = (o: {
  readonly coordinator: CoordinatorShape
  readonly runtime: VmRuntimeShape
  readonly residents?: Residents
  readonly target?: MoveTarget
  readonly report?: HostReport
  readonly link?: PeerLink.PeerLink
}) =>
  Effect.gen(function* () {
    const residents = o.residents ?? (yield* makeResidents("a", null, () => Effect.void))
    const agent = yield* makeAgent(defaultAgentConfig("a"), {
      coordinator: o.coordinator,
      runtime: o.runtime,
      measure: () => Effect.succeed(o.report ?? { totalMib: 16384, allocatableMib: 15360, totalVcpus: 8 }),
      residents,
      images: noImages,
      link: o.link ?? PeerLink.inMemory(new Map()),
      target: o.target ?? (yield* makeMoveTarget("a", o.runtime, residents)),
    })
    return { agent, residents }
  })
