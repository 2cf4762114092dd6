/**
 * The row locks of the store's transactions, and the locking host choice: core ranks, SQL
 * locks the best host no other transaction holds, core re-checks it under the lock. Lock
 * order: a transaction that locks several hosts locks them in id order.
 */
import { Placement } from "@engram/core"
import type { FleetHost, Limits } from "@engram/core"
import { and, eq, sql } from "drizzle-orm"
import type { SQL } from "drizzle-orm"
import { inJson, pipeline, query } from "./Db.js"
import type { Exec } from "./Db.js"
import { readRoom, roomSql, toCandidate, toRoomRow } from "./Room.js"
import type { RoomRow } from "./Room.js"
import type { MoveRow, SessionRow } from "./Rows.js"
import { hosts, moves, sessions } from "./schema.js"

/** The session row, locked for this transaction. */
export const lockSession = async (tx: Exec, id: string): Promise<SessionRow | undefined> =>
  (await tx.select().from(sessions).where(eq(sessions.id, id)).for("update"))[0]

/** The move row, locked for this transaction. */
export const lockMove = async (tx: Exec, id: string): Promise<MoveRow | undefined> =>
  (await tx.select().from(moves).where(eq(moves.id, id)).for("update"))[0]

/** The session's open (pending) move, locked. */
export const lockOpenMove = async (tx: Exec, sessionId: string): Promise<MoveRow | undefined> =>
  (
    await tx
      .select()
      .from(moves)
      .where(and(eq(moves.sessionId, sessionId), eq(moves.state, "pending")))
      .for("update")
  )[0]

/**
 * Locks host rows: the lock every transaction that adds a reservation to a host holds, so
 * two of them never judge the same room at once. `NO KEY UPDATE` (not `UPDATE`) so that
 * foreign-key checks of rows pointing at the host (`KEY SHARE`) do not wait on it.
 * `skipLocked`: answer without the host when another transaction holds it.
 */
export const lockHosts = async (
  tx: Exec,
  ids: readonly string[],
  options: { readonly skipLocked?: boolean } = {},
): Promise<string[]> => {
  if (ids.length === 0) return []
  const sorted = [...new Set(ids)].sort()
  const rows = await tx
    .select({ id: hosts.id })
    .from(hosts)
    .where(sorted.length === 1 ? eq(hosts.id, sorted[0] as string) : inJson(hosts.id, sorted))
    .orderBy(hosts.id)
    .for("no key update", options.skipLocked === true ? { skipLocked: true } : {})
  return rows.map((r) => r.id)
}

/** The outcome of a placement inside a transaction. */
export type Pick =
  | { readonly _tag: "Chosen"; readonly hostId: string }
  | { readonly _tag: "NoFit"; readonly hosts: readonly FleetHost[] }

/**
 * Locks the best-ranked host of `rankedIds` that no other transaction holds, skipping held
 * ones, in one statement (the job-queue pattern: ORDER BY rank LIMIT 1 FOR … SKIP LOCKED).
 */
const lockFirstFreeSql = (rankedIds: readonly string[]): SQL =>
  sql`select h.id from hosts h
    join jsonb_array_elements_text(${JSON.stringify(rankedIds)}::jsonb) with ordinality as r(id, rank) on r.id = h.id
    order by r.rank
    limit 1
    for no key update of h skip locked`

/** How many of the best-ranked hosts one locking statement considers. */
const lockWindow = 8

/**
 * Chooses a host for the request (core's host choice) and leaves it locked, with the budget
 * fitting on it under the lock. The room of every host comes from one unlocked read (`rows`,
 * or `readRoom`); core's `Placement.top` ranks the best few; one round trip locks the best of
 * them that no other placement holds and reads their sums again (after the lock); core's
 * `Placement.fitsOn` re-checks the locked host. A host that no longer fits (a lost race) goes
 * back into the pool with its fresh figures and we choose again; when every host of the
 * window is held we wait for the best one.
 */
export const pickAndLock = async (
  tx: Exec,
  req: Placement.Request,
  limits: Limits.Limits,
  options: { readonly rows?: readonly RoomRow[] | undefined } = {},
): Promise<Pick> => {
  const rows = options.rows ?? (await readRoom(tx, { columns: "room" }))
  const byId = new Map<string, FleetHost>()
  for (const r of rows) byId.set(r.id, toCandidate(r, limits))
  for (let round = 0; round <= byId.size + 2; round++) {
    const window = Placement.top(byId.values(), req, lockWindow, limits)
    const best = window[0]
    if (best === undefined) break
    // One round trip: lock the best host of the window no other transaction holds (a held
    // one is about to lose room, so concurrent placements spread over the next best instead
    // of queueing on one row lock), then read the window's sums. The server runs the two in
    // order and the read is a statement of its own, so its snapshot is taken once the lock
    // is held: fresh for the locked host.
    const [lockedRows, windowRows] = await pipeline(tx, [
      window.length === 1 ? sql`select id from hosts where id = ${best} for no key update skip locked` : lockFirstFreeSql(window),
      roomSql({ hostIds: window, columns: "room" }),
    ])
    let id = lockedRows?.[0]?.["id"] as string | undefined
    let freshRow = id === undefined ? undefined : windowRows?.find((r) => r["id"] === id)
    if (id === undefined) {
      // Every host of the window is held: wait for the best one, then read it afresh.
      id = (await lockHosts(tx, [best]))[0]
      if (id === undefined) {
        byId.delete(best)
        continue
      }
      freshRow = (await query<Record<string, unknown>>(tx, roomSql({ hostIds: [id], columns: "room" })))[0]
    }
    const fresh = freshRow === undefined ? undefined : toRoomRow(freshRow)
    if (fresh === undefined) {
      byId.delete(id)
      continue
    }
    const c = toCandidate(fresh, limits)
    byId.set(id, c)
    if (Placement.fitsOn(c, req.budget, limits)) return { _tag: "Chosen", hostId: id }
  }
  return { _tag: "NoFit", hosts: [...byId.values()] }
}
