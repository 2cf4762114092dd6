/**
 * The fence (SPEC §13): a write made under a lease (`CurrentFence` set by its leader) runs only
 * while the lease is still at that epoch. The apply statement checks it itself (`Apply.ts`: the
 * lease row `FOR SHARE`, so a takeover, which updates the row, waits until the write committed or
 * rolled back) and writes nothing at another epoch; the store then fails the write `Unavailable`
 * ("fenced"), which also rolls back the transaction it ran in. A check in a statement of its own
 * would not do on the pool: each statement commits alone, on any of its connections; `run` is that
 * check for the other writes under a lease, in a transaction.
 */
import { type Fence, Unavailable } from "@engram/store"
import type { SQL } from "drizzle-orm"
import { sql } from "drizzle-orm"
import { Effect } from "effect"
import { type Conn, retryAfterMs } from "./Db.js"

/**
 * Why a write under `f` was refused, given what the statement found (`{ epoch }`: the lease's
 * epoch, null when it has no row) or null when it was at `f`'s epoch.
 */
export const refusal = (f: Fence, found: { readonly epoch: unknown } | null): Unavailable | null =>
  found === null
    ? null
    : new Unavailable({
        reason: `fenced: lease ${f.name} is at epoch ${found.epoch === null || found.epoch === undefined ? "none" : String(found.epoch)}, this write was made under epoch ${f.epoch}`,
        retryAfterMs,
      })

const fenceSql = (f: Fence): SQL => sql`select epoch from leases where name = ${f.name} for share`

/**
 * Runs `statements` in order in the transaction `tx`, the fence first when there is one; answers
 * the last one's rows. A refusal fails the transaction (so it rolls back whole). Only in a
 * transaction: on the pool the check and the write would each commit alone.
 */
export const run = <E>(tx: Conn<E>, fence: Fence | null, statements: readonly SQL[]): Effect.Effect<Record<string, unknown>[], E> => {
  if (fence !== null && !tx.inTransaction) return Effect.die(new Error("store-pg: a write under a lease outside a transaction (its fence would not hold)"))
  if (fence === null) return statements.length === 1 ? tx.query(statements[0] as SQL) : Effect.map(tx.pipeline(statements), (r) => r.at(-1) ?? [])
  return Effect.flatMap(tx.pipeline([fenceSql(fence), ...statements]), (results) => {
    const row = results[0]?.[0]
    const refused = refusal(fence, row !== undefined && Number(row["epoch"]) === fence.epoch ? null : { epoch: row?.["epoch"] ?? null })
    return refused === null ? Effect.succeed(results.at(-1) ?? []) : Effect.fail(refused as E)
  })
}
