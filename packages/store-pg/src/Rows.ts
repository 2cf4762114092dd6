/** The store's records from their rows: sessions, reservations and moves. No decision here. */
import type { Move, Session, SessionState } from "@engram/core"
import type { MovePhases, MoveRound, Reservation, SessionEvent } from "@engram/store"
import type { moves, reservations, sessionEvents, sessions } from "./schema.js"

export type SessionRow = typeof sessions.$inferSelect
export type ReservationRow = typeof reservations.$inferSelect
export type MoveRow = typeof moves.$inferSelect
export type SessionEventRow = typeof sessionEvents.$inferSelect

/** A history entry from its row. */
export const toSessionEvent = (r: SessionEventRow): SessionEvent => ({
  sessionId: r.sessionId,
  seq: r.seq,
  at: r.at,
  event: r.event as Session.Event,
})

/** A session record from its row. */
export const toSession = (r: SessionRow): Session.Record => ({
  id: r.id,
  state: r.state as SessionState,
  budget: { memMib: r.memMib, vcpus: r.vcpus },
  affinity: r.affinity,
  hostId: r.hostId,
  reservationId: r.reservationId,
  queuedAt: r.queuedAt,
  parkedAt: r.parkedAt,
  idleTimeoutMs: r.idleTimeoutMs,
  lastActiveAt: r.lastActiveAt,
  endsAt: r.endsAt,
  template: r.template,
  imageHostId: r.imageHostId,
  createdAt: r.createdAt,
  updatedAt: r.updatedAt,
})

/** A ledger entry from its row. */
export const toReservation = (r: ReservationRow): Reservation => ({
  id: r.id,
  hostId: r.hostId,
  ownerKind: r.ownerKind,
  ownerId: r.ownerId,
  memMib: r.memMib,
  vcpus: r.vcpus,
  vramMib: r.vramMib,
  createdAt: r.createdAt,
  lastHeartbeatAt: r.lastHeartbeatAt,
  expiresAt: r.expiresAt,
  description: r.description,
})

/** A move record from its row. */
export const toMove = (r: MoveRow): Move.Record => ({
  id: r.id,
  sessionId: r.sessionId,
  sourceHostId: r.sourceHostId,
  targetHostId: r.targetHostId,
  reservationId: r.reservationId,
  maxDowntimeMs: r.maxDowntimeMs,
  state: r.state,
  rounds: r.rounds as MoveRound[],
  phases: r.phases as MovePhases | null,
  abortReason: r.abortReason,
  abortEstimateMs: r.abortEstimateMs,
  guard: r.guard as Move.Guard | null,
  resendOwed: r.resendOwed,
  resendClears: r.resendClears,
  committedBy: r.committedBy ?? null,
  createdAt: r.createdAt,
  endedAt: r.endedAt,
})
