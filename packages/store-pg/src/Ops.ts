/**
 * The SQL building blocks of the store's operations: row mappings, the host lock, the
 * placement loop (read room without locks, pick with core, lock the one chosen host,
 * re-check with core under the lock), and the ledger writes that keep the metrics.
 * Everything here runs inside a transaction the caller opened.
 */
import { Placement } from "@engram/core"
import type { FleetHost, Limits, SessionState } from "@engram/core"
import type { Move, MovePhases, MoveRound, Reservation, Session } from "@engram/store"
import { and, eq, sql } from "drizzle-orm"
import type { SQL, SQLWrapper } from "drizzle-orm"
import { pipeline, query } from "./Db.js"
import type { Exec } from "./Db.js"
import { readRoom, roomSql, toCandidate, toRoomRow } from "./Room.js"
import type { RoomRow } from "./Room.js"
import type { reservations } from "./schema.js"
import { hosts, moves, sessions } from "./schema.js"

export type SessionRow = typeof sessions.$inferSelect
export type ReservationRow = typeof reservations.$inferSelect
export type MoveRow = typeof moves.$inferSelect

/** A session record from its row. */
export const toSession = (r: SessionRow): Session => ({
  id: r.id,
  state: r.state as SessionState,
  budget: { memMib: r.memMib, vcpus: r.vcpus },
  affinity: r.affinity,
  hostId: r.hostId,
  reservationId: r.reservationId,
  queuedAt: r.queuedAt,
  parkedAt: r.parkedAt,
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
export const toMove = (r: MoveRow): Move => ({
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
  createdAt: r.createdAt,
  endedAt: r.endedAt,
})

/**
 * `column in (…ids)` with the ids as one jsonb parameter: the statement text stays the same
 * whatever the number of ids, so it is prepared once per connection.
 */
export const inJson = (column: SQLWrapper, ids: readonly string[]): SQL =>
  sql`${column} in (select jsonb_array_elements_text(${JSON.stringify(ids)}::jsonb))`

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
 * Chooses a host for the request and leaves it locked, with the budget fitting on it under
 * the lock. The room of every host comes from one unlocked read (`rows`, or `readRoom`);
 * core's `Placement.pick` ranks; one round trip locks the best host of the top few that no
 * other placement holds and reads their sums again (after the lock); core's
 * `Placement.fitsOn` re-checks the locked host. A host that no longer fits (a lost race)
 * goes back into the pool with its fresh figures and we pick again; when every host of the
 * window is held we wait for the best one.
 */
export const pickAndLock = async (
  tx: Exec,
  req: Placement.Request,
  limits: Limits.Limits,
  options: {
    readonly excludeHostId?: string | undefined
    readonly rows?: readonly RoomRow[] | undefined
  } = {},
): Promise<Pick> => {
  const rows = options.rows ?? (await readRoom(tx, { columns: "room" }))
  const byId = new Map<string, FleetHost>()
  for (const r of rows) if (r.id !== options.excludeHostId) byId.set(r.id, toCandidate(r, limits))
  for (let round = 0; round <= byId.size + 2; round++) {
    // The best few hosts by core's ranking (repeated picks: O(k·n), no full sort).
    const window: string[] = []
    const pool = new Map(byId)
    while (window.length < lockWindow) {
      const next = Placement.pick(pool.values(), req, limits)
      if (next === null) break
      window.push(next)
      pool.delete(next)
    }
    const best = window[0]
    if (best === undefined) break
    // One round trip: lock the best host of the window no other transaction holds (a held
    // one is about to lose room, so concurrent placements spread over the next best instead
    // of queueing on one row lock), then read the window's sums. The server runs the two in
    // order and the read is a statement of its own, so its snapshot is taken once the lock
    // is held: fresh for the locked host.
    const [lockedRows, windowRows] = await pipeline(tx, [
      window.length === 1
        ? sql`select id from hosts where id = ${best} for no key update skip locked`
        : lockFirstFreeSql(window),
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

/**
 * `update hosts …` adding (`+`) or removing (`-`) the entries of `from` (a CTE of inserted or
 * deleted reservations: `host_id`, `mem_mib`, `vcpus`) to or from each host's maintained
 * sums, and bumping its version: every ledger write runs it in the same statement. Amounts
 * go float8 → numeric exactly as `host_reserved_sums` converts them, so the sums stay equal.
 */
export const hostSumsSql = (sign: "+" | "-", from: SQL): SQL => {
  const op = sql.raw(sign)
  return sql`update hosts set
      reserved_mem_mib = hosts.reserved_mem_mib ${op} x.mem,
      reserved_vcpus = hosts.reserved_vcpus ${op} x.vcpus,
      entries = hosts.entries ${op} x.n,
      version = hosts.version + 1
    from (select host_id, sum(mem_mib::numeric) as mem, sum(vcpus::numeric) as vcpus, count(*)::int as n
          from ${from} group by host_id) x
    where hosts.id = x.host_id`
}

type MetricColumn = "total_reserved_mib" | "total_released_mib" | "total_reclaimed_mib" | "reserve_failures"

/**
 * `insert into metrics … on conflict do update` adding `amount` (an SQL expression over
 * `from`) to one counter of this backend's shard; adds nothing when `from` is empty.
 */
export const bumpMetricSql = (column: MetricColumn, amount: SQL, from: SQL): SQL => {
  const col = sql.raw(column)
  return sql`insert into metrics (shard, ${col})
    select pg_backend_pid() % 64, ${amount} from ${from} having count(*) > 0
    on conflict (shard) do update set ${col} = metrics.${col} + excluded.${col}`
}

/** Counts one refused `reserve()`. */
export const countReserveFailure = async (tx: Exec): Promise<void> => {
  await tx.execute(bumpMetricSql("reserve_failures", sql`1`, sql`(select 1) one`))
}

/**
 * Deletes reservations and counts their RAM as released or reclaimed, in one statement.
 * Answers the deleted entries.
 */
export const removeEntries = async (
  tx: Exec,
  ids: readonly string[],
  how: "released" | "reclaimed",
): Promise<Reservation[]> => {
  const unique = [...new Set(ids)]
  if (unique.length === 0) return []
  const rows = await query<Record<string, unknown>>(
    tx,
    sql`with d as (
      delete from reservations
      where id in (select jsonb_array_elements_text(${JSON.stringify(unique)}::jsonb))
      returning *
    ), m as (
      ${bumpMetricSql(how === "released" ? "total_released_mib" : "total_reclaimed_mib", sql`sum(mem_mib)`, sql`d`)}
    ), h as (${hostSumsSql("-", sql`d`)})
    select id, host_id as "hostId", owner_kind as "ownerKind", owner_id as "ownerId", mem_mib as "memMib",
      vcpus, vram_mib as "vramMib", created_at::float8 as "createdAt", last_heartbeat_at::float8 as "lastHeartbeatAt",
      expires_at as "expiresAt", description
    from d order by id`,
  )
  return rows.map((r) => ({
    id: r["id"] as string,
    hostId: r["hostId"] as string,
    ownerKind: r["ownerKind"] as Reservation["ownerKind"],
    ownerId: r["ownerId"] as string,
    memMib: Number(r["memMib"]),
    vcpus: Number(r["vcpus"]),
    vramMib: r["vramMib"] == null ? null : Number(r["vramMib"]),
    createdAt: Number(r["createdAt"]),
    lastHeartbeatAt: Number(r["lastHeartbeatAt"]),
    expiresAt: r["expiresAt"] == null ? null : Number(r["expiresAt"]),
    description: (r["description"] as string | null) ?? null,
  }))
}

/** A new reservation row, counted in `totalReservedMib` in the same statement. */
export const insertEntry = async (
  tx: Exec,
  e: {
    readonly id: string
    readonly hostId: string
    readonly ownerKind: Reservation["ownerKind"]
    readonly ownerId: string
    readonly memMib: number
    readonly vcpus: number
    readonly vramMib?: number | null
    readonly expiresAt?: number | null
    readonly description?: string | null
    readonly now: number
  },
): Promise<void> => {
  await tx.execute(sql`with r as (
      insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, vram_mib, created_at, last_heartbeat_at, expires_at, description)
      values (${e.id}, ${e.hostId}, ${e.ownerKind}, ${e.ownerId}, ${e.memMib}, ${e.vcpus}, ${e.vramMib ?? null}, ${e.now}, ${e.now},
        ${e.expiresAt ?? null}, ${e.description ?? null})
      returning host_id, mem_mib, vcpus
    ), h as (${hostSumsSql("+", sql`r`)})
    ${bumpMetricSql("total_reserved_mib", sql`sum(mem_mib)`, sql`r`)}`)
}

/** The 1-based FIFO position of a queued session. */
export const queuePosition = async (tx: Exec, s: { readonly id: string; readonly queuedAt: number | null }): Promise<number> => {
  if (s.queuedAt === null) return 0
  const rows = await query<{ n: number }>(
    tx,
    sql`select count(*)::int as n from sessions
      where state = 'queued' and (queued_at < ${s.queuedAt} or (queued_at = ${s.queuedAt} and id <= ${s.id}))`,
  )
  return Number(rows[0]?.n ?? 0)
}
