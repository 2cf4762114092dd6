/**
 * What every concern of the store (hosts, sessions, queue, ledger, moves) is built from: the
 * database, the limits and the park policy in force, the Clock, and the host cache.
 * `StorePg.ts` builds one and hands it to each concern.
 */
import type { Limits, ParkPolicy } from "@engram/core"
import type { Effect } from "effect"
import type { Db } from "./Db.js"
import type { HostCache } from "./HostCache.js"

/** The parts a concern module is built from. */
export interface Deps {
  readonly db: Db
  /** The limits the store decides with now (a test reset may change them). */
  readonly limits: () => Limits.Limits
  /** The park policy an idle session's step decides with. */
  readonly park: ParkPolicy.Rule
  /** The store's time, in epoch ms: the Effect Clock's, or with `databaseTime` the database's clock as this process reads it (`DatabaseTime.ts`). */
  readonly now: Effect.Effect<number>
  readonly cache: HostCache
  /** Two reads of one transaction at once: pipelined on postgres.js, one after the other on PGlite. */
  readonly both: <A, B, E>(a: Effect.Effect<A, E>, b: Effect.Effect<B, E>) => Effect.Effect<[A, B], E>
}
