/**
 * The fence (SPEC §13): a write made under a lease (`CurrentFence` set by its leader) runs only
 * while the lease is still at that epoch. The check is a statement of the write's own round
 * trip, before it: `FOR SHARE` on the lease row, so inside a transaction a takeover (which
 * updates the row) waits until the write committed or rolled back, and a write that finds a newer
 * epoch fails `Unavailable` ("fenced"), which rolls its transaction back. The reaper's writes
 * (reclaim, descents, drains) all run in transactions; on the pool the check is only the
 * statement before.
 */
import { type Fence, Unavailable } from "@engram/store"
import type { SQL } from "drizzle-orm"
import { sql } from "drizzle-orm"
import { Effect } from "effect"
import { type Conn, retryAfterMs } from "./Db.js"

const fenceSql = (f: Fence): SQL => sql`select epoch from leases where name = ${f.name} for share`

/** Why a write under `f` is refused, given the lease row read beside it, or null. */
export const refusal = (f: Fence, rows: readonly Record<string, unknown>[]): Unavailable | null => {
  const epoch = rows[0]?.["epoch"]
  return epoch !== undefined && Number(epoch) === f.epoch
    ? null
    : new Unavailable({
        reason: `fenced: lease ${f.name} is at epoch ${epoch === undefined ? "none" : String(epoch)}, this write was made under epoch ${f.epoch}`,
        retryAfterMs,
      })
}

/**
 * Runs `statements` in order on `conn` (the fence first when there is one); answers the last
 * one's rows. A refusal is the connection's own `Unavailable` (every connection's errors hold it).
 */
export const run = <E>(conn: Conn<E>, fence: Fence | null, statements: readonly SQL[]): Effect.Effect<Record<string, unknown>[], E> => {
  if (fence === null) return statements.length === 1 ? conn.query(statements[0] as SQL) : Effect.map(conn.pipeline(statements), (r) => r.at(-1) ?? [])
  return Effect.flatMap(conn.pipeline([fenceSql(fence), ...statements]), (results) => {
    const refused = refusal(fence, results[0] ?? [])
    return refused === null ? Effect.succeed(results.at(-1) ?? []) : Effect.fail(refused as E)
  })
}
