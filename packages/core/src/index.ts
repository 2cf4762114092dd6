/**
 * @engram/core: the pure decisions of engram. Every function is synchronous and total over
 * plain data; time, ids and limits are arguments.
 */
export * as Downtime from "./Downtime.js"
export * as Fleet from "./Fleet.js"
export * as Headroom from "./Headroom.js"
export * as Ledger from "./Ledger.js"
export * as Lifetime from "./Lifetime.js"
export * as MakeRoom from "./MakeRoom.js"
export * as Limits from "./Limits.js"
export * as Move from "./Move.js"
export * as Names from "./Names.js"
export * as Order from "./Order.js"
export * as ParkGate from "./ParkGate.js"
export * as ParkPolicy from "./ParkPolicy.js"
export * as Plan from "./Plan.js"
export * as Placement from "./Placement.js"
export * as PlacementIndex from "./PlacementIndex.js"
export * as QueueWalk from "./QueueWalk.js"
export * as Reclaim from "./Reclaim.js"
export * as Session from "./Session.js"

export type { Budget, HostHeadroom, HostReport } from "./Headroom.js"
export type { Candidate, HostState, NoFitDetail, NoFitReason, Request as PlacementRequest } from "./Placement.js"
export type { FleetHost, FleetView, Park, Queued, Yield, YieldReason } from "./ParkGate.js"
export type { Entry as LedgerEntry, OwnerKind } from "./Ledger.js"
export type { State as SessionState } from "./Session.js"
export type { MoveCommittedBy, MoveState, RoundKind } from "./Names.js"
