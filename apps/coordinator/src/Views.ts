/**
 * The store's records as the API shows them: a host with its room (capacity after policy
 * beside the figure it reported, through core `Headroom`), and a placement's answer.
 */
import type { Records } from "@engram/api"
import { Headroom } from "@engram/core"
import type { HostView, PlaceOutcome } from "@engram/store"

/** A host as the API shows it. */
export const hostJson = (h: HostView): Records.Host => ({
  id: h.id,
  labels: h.labels,
  state: h.state,
  measured: h.measured,
  report: h.report,
  reportedAt: h.reportedAt,
  createdAt: h.createdAt,
  allocatableMib: h.headroom.allocatableMib,
  reportedAllocatableMib: h.report?.allocatableMib ?? null,
  reservedMib: h.headroom.reserved.memMib,
  freeMib: Headroom.freeMib(h.headroom),
  cpuBudget: h.headroom.cpuBudget,
  reservedVcpus: h.headroom.reserved.vcpus,
  freeVcpus: Headroom.freeVcpus(h.headroom),
  entries: h.entries,
  parks: h.parks,
  descentsRunning: h.descentsRunning,
})

/** A create's or resume's answer: 201 placed, or 202 queued with position and no-fit details. */
export const placeAnswer = (o: PlaceOutcome): Records.Placed | Records.Queued =>
  o._tag === "Placed" && o.session.hostId !== null
    ? { id: o.session.id, state: o.session.state, hostId: o.session.hostId }
    : { id: o.session.id, state: o.session.state, position: o._tag === "Queued" ? o.position : 0, noFit: o._tag === "Queued" ? o.noFit : [] }
