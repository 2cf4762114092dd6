/**
 * Leadership (SPEC §4.3, §13): which replica runs the reaper. A leader holds a lease it renews
 * in its store; one that cannot renew within its renew deadline (shorter than the lease) stops
 * acting by itself; another replica takes over once the lease went unrenewed for a whole lease
 * duration, with the next epoch. Every write the leader makes carries its epoch (`CurrentFence`)
 * and a store refuses it, inside the same transaction as the write, once a newer epoch exists:
 * a leader that wakes up from a freeze changes nothing.
 *
 * Backends implement it: `@engram/store-pg` on PostgreSQL (a lease row); a single process (an
 * embedded store, the in-memory store) always leads, unfenced (`Leadership.single`).
 */
import { Context, Effect, Layer } from "effect"

/** What a leader's writes carry: the lease they were made under, and its epoch. */
export interface Fence {
  readonly name: string
  readonly epoch: number
}

/**
 * The fence of the writes made in this fiber (null: unfenced). A store's apply checks it in the
 * same transaction as the write and refuses the write (`Unavailable`, "fenced") when the lease
 * has moved to a newer epoch.
 */
export const CurrentFence = Context.Reference<Fence | null>("@engram/store/CurrentFence", { defaultValue: () => null })

/** The timing of a lease, ms (client-go's leaderelection has the same three). */
export interface LeaseTimes {
  /** How long a lease not seen renewed stays held: then another replica may take it. */
  readonly leaseDurationMs: number
  /** How long the holder goes on acting after its last renewal: less than `leaseDurationMs`. */
  readonly renewDeadlineMs: number
}

/** The defaults: a 15 s lease, acted on for 10 s after a renewal (Kubernetes' defaults). */
export const defaultLeaseTimes: LeaseTimes = { leaseDurationMs: 15_000, renewDeadlineMs: 10_000 }

/** Why lease times are refused, or null. */
export const checkLeaseTimes = (t: LeaseTimes): string | null =>
  !Number.isInteger(t.leaseDurationMs) || t.leaseDurationMs <= 0
    ? "leaseDurationMs must be an integer > 0"
    : !Number.isInteger(t.renewDeadlineMs) || t.renewDeadlineMs <= 0 || t.renewDeadlineMs >= t.leaseDurationMs
      ? "renewDeadlineMs must be an integer > 0 and < leaseDurationMs"
      : null

export interface LeadershipShape {
  /** Takes, renews or watches the lease (one round trip); answers whether this replica leads now. Never fails. */
  readonly tick: Effect.Effect<boolean>
  /** Whether this replica may act now: it holds the lease and renewed it within the renew deadline. No I/O. */
  readonly isLeader: () => boolean
  /**
   * Whether this replica holds the lease's epoch, acting or not (past its renew deadline it does
   * not act, and renews once the database answers). Absent: as `isLeader`. No I/O.
   */
  readonly holds?: (() => boolean) | undefined
  /** The fence of this replica's writes while it leads; null when it does not (or needs none). */
  readonly fence: () => Fence | null
  /**
   * The leader's internal address as last seen (its own while it leads), or null: none
   * advertised, or not known. Where the coordinator's replicas forward their creates. No I/O.
   */
  readonly leaderUrl?: (() => string | null) | undefined
  /**
   * A fingerprint of the leader's admin token as last seen (its own while it leads), or null:
   * none written, or not known. Replicas compare theirs with it. No I/O.
   */
  readonly leaderAdminTokenHash?: (() => string | null) | undefined
  /**
   * How long, on this replica's clock, since it last saw the lease renewed or taken by anyone
   * (itself included; since it began watching when it has seen nothing yet). Grows on every
   * replica while no replica leads: the lease's holder is frozen, cut off or not renewing, or
   * this replica cannot read the lease. No I/O. Absent: always the leader (one process).
   */
  readonly unrenewedMs?: (() => number) | undefined
  /**
   * The database's clock less this replica's (ms), as its last lease check measured it (null:
   * not measured yet). Reservations' heartbeats are stamped, and judged stale, on the replicas'
   * own clocks: a replica far off makes live hosts look stale, or stale ones live. Absent: one
   * process (one clock).
   */
  readonly clockSkewMs?: (() => number | null) | undefined
  /**
   * Gives the lease up now, for good (a replica that is stopping): it no longer leads nor takes
   * the lease again, and another replica may take it at its next check instead of after a whole
   * lease. Never fails (a lease it cannot write is taken over after its lease, as a crashed
   * holder's). Absent: nothing to give up (one process).
   */
  readonly giveUp?: Effect.Effect<void> | undefined
  /**
   * Gives the lease up now, not for good (a leader whose own store calls keep failing while its
   * lease connection works; or a replica that does not lead, whose store read failed, stands
   * aside): it no longer leads nor takes the lease until `standAgain`, but goes on watching it
   * (`leaderUrl`), and another replica may take it at its next check. Never fails (a lease it
   * cannot write is taken over after its lease). Absent: nothing to give up.
   */
  readonly stepDown?: Effect.Effect<void> | undefined
  /** After `stepDown`: this replica may take the lease again (when nobody holds it). No I/O. */
  readonly standAgain?: (() => void) | undefined
}

export class Leadership extends Context.Service<Leadership, LeadershipShape>()("@engram/store/Leadership") {
  /** One process: always the leader, its writes unfenced. */
  static readonly single: Layer.Layer<Leadership> = Layer.succeed(
    Leadership,
    Leadership.of({ tick: Effect.succeed(true), isLeader: () => true, fence: () => null }),
  )
}
