/**
 * What every concern of the store (hosts, sessions, queue, ledger, moves) is built from:
 * the database, the limits in force, the Clock, the transaction runner, single-statement
 * reads, and the placement cache. `StorePg.ts` builds one and hands it to each concern.
 */
import type { Limits } from "@engram/core"
import type { Unavailable } from "@engram/store"
import type { Effect } from "effect"
import type { Db, Exec } from "./Db.js"
import type { PlacementCache } from "./PlacementCache.js"
import type { Op } from "./Transaction.js"

/** The parts a concern module is built from. */
export interface Deps {
  readonly db: Db
  /** The limits the store decides with now (a test reset may change them). */
  readonly limits: () => Limits.Limits
  /** The time from the Effect Clock, in epoch ms. */
  readonly now: Effect.Effect<number>
  /** Runs a transaction body until it decides (see `Transaction.makeOp`). */
  readonly op: Op
  /** A read outside a transaction (one statement). */
  readonly read: <A>(body: (exec: Exec) => Promise<A>) => Effect.Effect<A, Unavailable>
  /** Two reads of one transaction: pipelined on postgres.js, one after the other on PGlite. */
  readonly both: <A, B>(a: () => Promise<A>, b: () => Promise<B>) => Promise<[A, B]>
  readonly cache: PlacementCache
}
