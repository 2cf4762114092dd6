/**
 * The store's records as the API shows them: a host with its room (capacity after policy
 * beside the figure it reported, through core `Headroom`), a placement's and a resume's
 * answer, a session with where it stands in the queue, and a session's history.
 */
import type { Records } from "@engram/api"
import { Headroom, Placement } from "@engram/core"
import type { Limits } from "@engram/core"
import type { HostView, Page, PlaceOutcome, QueueStanding, Session, SessionEvent } from "@engram/store"

/**
 * A host as the API shows it; with `at` (the answer's time and the store's limits) it says
 * whether the host's agent is silent then (`Placement.isSilent`: it takes no placements).
 */
export const hostJson = (h: HostView, at?: { readonly now: number; readonly limits: Limits.Limits }): Records.Host => ({
  id: h.id,
  labels: h.labels,
  state: h.state,
  measured: h.measured,
  report: h.report === null ? null : { totalMib: h.report.totalMib, allocatableMib: h.report.allocatableMib, totalVcpus: h.report.totalVcpus, templates: h.report.templates ?? [] },
  reportedAt: h.reportedAt,
  createdAt: h.createdAt,
  peerUrl: h.peerUrl,
  ...(at === undefined ? {} : { silent: Placement.isSilent(h, at.now, at.limits) }),
  allocatableMib: Headroom.shown(h.headroom.allocatableMib),
  reportedAllocatableMib: h.report?.allocatableMib ?? null,
  reservedMib: h.headroom.reserved.memMib,
  freeMib: Headroom.shownFreeMib(h.headroom),
  cpuBudget: Headroom.shown(h.headroom.cpuBudget),
  reservedVcpus: h.headroom.reserved.vcpus,
  freeVcpus: Headroom.shownFreeVcpus(h.headroom),
  entries: h.entries,
  parks: h.parks,
  descentsRunning: h.descentsRunning,
})

/** A create's answer: 201 placed, or 202 queued with position, no-fit details and `tooBig`. */
export const placeAnswer = (o: PlaceOutcome): Records.Placed | Records.Queued =>
  o._tag === "Placed" && o.session.hostId !== null
    ? { id: o.session.id, state: o.session.state, hostId: o.session.hostId }
    : {
        id: o.session.id,
        state: o.session.state,
        position: o._tag === "Queued" ? o.position : 0,
        noFit: o._tag === "Queued" ? o.noFit : [],
        tooBig: o._tag === "Queued" && o.tooBig,
      }

/**
 * A resume's answer: 200 warm (a park running again on its host: the store answers `Placed` in
 * state running), 201 placed cold, or 202 queued cold.
 */
export const resumeAnswer = (o: PlaceOutcome): Records.ResumedWarm | Records.ResumedPlaced | Records.ResumedQueued => {
  if (o._tag === "Placed" && o.session.hostId !== null)
    return o.session.state === "running"
      ? { id: o.session.id, state: o.session.state, hostId: o.session.hostId, resumed: "warm" }
      : { id: o.session.id, state: o.session.state, hostId: o.session.hostId, resumed: "cold" }
  return { ...(placeAnswer(o) as Records.Queued), resumed: "cold" }
}

/** A session with where it stands in the queue (null when it is not queued). */
export const sessionDetail = (s: Session, standing: QueueStanding | null): Records.SessionDetail => ({
  ...s,
  queue: standing === null ? null : { position: standing.position, noFit: standing.noFit, tooBig: standing.tooBig },
})

/** A page of the store as a page of the API. */
export const pageJson = <A, B>(page: Page<A>, item: (a: A) => B): { readonly items: readonly B[]; readonly nextCursor: string | null } => ({
  items: page.items.map(item),
  nextCursor: page.nextCursor,
})

/** One entry of a session's history as the API shows it: core's event, named by `kind`. */
export const eventJson = (x: SessionEvent): Records.SessionEvent => {
  const at = { seq: x.seq, at: x.at }
  const e = x.event
  switch (e._tag) {
    case "Created":
      return { ...at, kind: "created" }
    case "Queued":
      return { ...at, kind: "queued" }
    case "Placed":
      return { ...at, kind: "placed", hostId: e.hostId }
    case "Running":
      return { ...at, kind: "running", hostId: e.hostId }
    case "Parked":
      return { ...at, kind: "parked", hostId: e.hostId }
    case "Descending":
      return { ...at, kind: "descending", hostId: e.hostId, cause: e.cause, reason: e.reason }
    case "Descended":
      return { ...at, kind: "descended", hostId: e.hostId }
    case "Resumed":
      return { ...at, kind: "resumed", resumed: e.warm ? "warm" : "cold", hostId: e.hostId }
    case "MoveBegun":
      return { ...at, kind: "move_begun", moveId: e.moveId, hostId: e.hostId, targetHostId: e.targetHostId }
    case "Moved":
      return { ...at, kind: "moved", moveId: e.moveId, hostId: e.toHostId, fromHostId: e.fromHostId, toHostId: e.toHostId, phases: e.phases }
    case "MoveAborted":
      return { ...at, kind: "move_aborted", moveId: e.moveId, hostId: e.hostId, reason: e.reason, estimateMs: e.estimateMs }
    case "Lost":
      return { ...at, kind: "lost", hostId: e.hostId }
    case "Ended":
      return e.reason === undefined ? { ...at, kind: "ended", hostId: e.hostId } : { ...at, kind: "ended", hostId: e.hostId, reason: e.reason }
    case "TtlSet":
      return { ...at, kind: "ttl_set", endsAt: e.endsAt }
    case "GuestLost":
      return e.moveId === undefined || e.toHostId === undefined
        ? { ...at, kind: "guest_lost", hostId: e.hostId, reason: e.reason }
        : { ...at, kind: "guest_lost", hostId: e.hostId, reason: e.reason, moveId: e.moveId, toHostId: e.toHostId }
  }
}
