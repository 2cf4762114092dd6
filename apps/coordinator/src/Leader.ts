/**
 * Reaper leadership: `@engram/store`'s `Leadership`. On PostgreSQL it is a lease with fencing
 * (`@engram/store-pg`'s `Lease`: renewed every `leaseRetryMs`, acted on only within the renew
 * deadline, taken over by another replica once unrenewed for the lease duration; the leader's
 * writes carry its epoch and are refused once a newer one exists). An embedded store has one
 * process: it always leads, unfenced. The coordinator imports no database driver for it.
 */
import { Leadership, type LeaseTimes, type Unavailable } from "@engram/store"
import { Lease } from "@engram/store-pg"
import type { Layer } from "effect"

export { Leadership as Leader }

/** One process: always the leader. */
export const always: Layer.Layer<Leadership> = Leadership.single

/**
 * The lease on the PostgreSQL at `url`, held as `holder` (unique per replica); while it leads,
 * it writes `advertise()` with the lease: the address other replicas forward creates to.
 */
export const postgres = (
  url: string,
  times: LeaseTimes,
  holder?: string,
  advertise?: () => string | null,
  adminTokenHash?: () => string | null,
): Layer.Layer<Leadership, Unavailable> => Lease.layer({ url, ...times, holder, advertise, adminTokenHash })

/** How often a replica renews or looks at the lease: a third of the renew deadline, at most 2 s. */
export const leaseRetryMs = (times: LeaseTimes): number => Math.max(10, Math.min(2000, Math.floor(times.renewDeadlineMs / 3)))
