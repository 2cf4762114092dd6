/**
 * The store's writes: the ledger writes that keep each host's maintained sums and the
 * cumulative metrics in the same statement, and `applyStep`, which writes one answer of
 * core's `Session.step` (ledger changes, the move change, the session record) inside the
 * caller's transaction. What to write is decided by core; this module only writes it.
 */
import type { Session as SessionRules } from "@engram/core"
import type { Move, Reservation, Session } from "@engram/store"
import { eq, sql } from "drizzle-orm"
import type { SQL } from "drizzle-orm"
import { query } from "./Db.js"
import type { Exec } from "./Db.js"
import { toMove, toSession } from "./Rows.js"
import type { MoveRow, SessionRow } from "./Rows.js"
import { moves, reservations, sessions } from "./schema.js"

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
  if (unique.length > 1) {
    // Entries on several hosts: their hosts' rows are locked in id order first (the one lock
    // order), so two transactions releasing across the same hosts never wait on each other in a circle.
    const held = await query<{ host_id: string }>(
      tx,
      sql`select distinct host_id from reservations where id in (select jsonb_array_elements_text(${JSON.stringify(unique)}::jsonb))`,
    )
    if (held.length > 1) await lockHostRows(tx, held.map((r) => r.host_id))
  }
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

/** Locks host rows in id order (`NO KEY UPDATE`, as every ledger write takes them). */
export const lockHostRows = async (tx: Exec, ids: readonly string[]): Promise<void> => {
  const sorted = [...new Set(ids)].sort()
  if (sorted.length === 0) return
  await tx.execute(sql`select id from hosts where id in (select jsonb_array_elements_text(${JSON.stringify(sorted)}::jsonb))
    order by id for no key update`)
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

/** Writes a move's next record (a commit or a close): its state, phases, abort reason and estimate, end. */
export const updateMove = async (tx: Exec, m: Move): Promise<Move> => {
  const [row] = await tx
    .update(moves)
    .set({ state: m.state, phases: m.phases, abortReason: m.abortReason, abortEstimateMs: m.abortEstimateMs, endedAt: m.endedAt })
    .where(eq(moves.id, m.id))
    .returning()
  return toMove(row as MoveRow)
}

/** Writes a session's next record (every field a step may change). */
export const updateSession = async (tx: Exec, s: Session): Promise<Session> => {
  const [row] = await tx
    .update(sessions)
    .set({
      state: s.state,
      hostId: s.hostId,
      reservationId: s.reservationId,
      queuedAt: s.queuedAt,
      parkedAt: s.parkedAt,
      updatedAt: s.updatedAt,
    })
    .where(eq(sessions.id, s.id))
    .returning()
  return toSession(row as SessionRow)
}

/**
 * Writes the ledger changes of a step: new reservations, hand-overs, and releases (grouped
 * by how they count in the metrics).
 */
export const applyLedger = async (tx: Exec, changes: readonly SessionRules.LedgerChange[]): Promise<void> => {
  const released: string[] = []
  const reclaimed: string[] = []
  for (const c of changes) {
    if (c._tag === "Reserve") await insertEntry(tx, { ...c.entry, now: c.entry.createdAt })
    else if (c._tag === "Transfer")
      await tx
        .update(reservations)
        .set({ ownerKind: "session", ownerId: c.ownerId, lastHeartbeatAt: c.heartbeatAt })
        .where(eq(reservations.id, c.id))
    else (c.how === "released" ? released : reclaimed).push(c.id)
  }
  await removeEntries(tx, released, "released")
  await removeEntries(tx, reclaimed, "reclaimed")
}

/** Writes a step's move change: a new move, or its next record. */
export const applyMove = async (tx: Exec, change: SessionRules.MoveChange | null): Promise<Move | null> => {
  if (change === null) return null
  if (change._tag !== "Open") return updateMove(tx, change.move)
  const m = change.move
  const [row] = await tx
    .insert(moves)
    .values({ ...m, rounds: [...m.rounds] })
    .returning()
  return toMove(row as MoveRow)
}

/** What a step said happened to one session, at one time. */
export interface EventsOf {
  readonly sessionId: string
  readonly at: number
  readonly events: readonly SessionRules.Event[]
}

/**
 * The rows of `events` as one jsonb parameter (`sid`, `at`, `n` = the event's place among
 * those of its session here, from 1, `e` = the event), for `eventsSql`.
 */
export const eventRows = (events: readonly EventsOf[]): string => {
  const next = new Map<string, number>()
  const rows: { sid: string; at: number; n: number; e: SessionRules.Event }[] = []
  for (const { sessionId, at, events: list } of events)
    for (const e of list) {
      const n = (next.get(sessionId) ?? 0) + 1
      next.set(sessionId, n)
      rows.push({ sid: sessionId, at, n, e })
    }
  return JSON.stringify(rows)
}

/**
 * `insert into session_events …` of the rows of `eventRows`: each event numbered after the
 * last its session has. Every caller holds the row lock of every session it writes events
 * for (or inserts the session in the same statement), so the numbers never collide.
 */
export const eventsSql = (rows: string): SQL => sql`insert into session_events (session_id, seq, at, event)
    select x.sid, coalesce(last.seq, 0) + x.n, x.at, x.e
    from jsonb_to_recordset(${rows}::jsonb) as x(sid text, at bigint, n int, e jsonb)
    left join (
      select session_id, max(seq) as seq from session_events
      where session_id in (select jsonb_array_elements(${rows}::jsonb)->>'sid')
      group by session_id
    ) last on last.session_id = x.sid`

/** Writes the history of steps, in the caller's transaction. */
export const insertEvents = async (tx: Exec, events: readonly EventsOf[]): Promise<void> => {
  if (!events.some((e) => e.events.length > 0)) return
  await tx.execute(eventsSql(eventRows(events)))
}

/**
 * Writes one applied step of an existing session, in the caller's transaction: the ledger,
 * the move, the session, then its history. Answers the written session and move.
 */
export const applyStep = async (tx: Exec, answer: SessionRules.Applied): Promise<{ session: Session; move: Move | null }> => {
  await applyLedger(tx, answer.ledger)
  const move = await applyMove(tx, answer.move)
  const session = await updateSession(tx, answer.session)
  await insertEvents(tx, [{ sessionId: session.id, at: answer.session.updatedAt, events: answer.events }])
  return { session, move }
}

/** Writes the next records of several sessions in one statement (a reclaim's cascade). */
export const updateSessions = async (tx: Exec, records: readonly Session[]): Promise<void> => {
  if (records.length === 0) return
  const rows = JSON.stringify(
    records.map((s) => ({ id: s.id, state: s.state, hid: s.hostId, rid: s.reservationId, qat: s.queuedAt, pat: s.parkedAt, uat: s.updatedAt })),
  )
  await tx.execute(sql`update sessions set state = p.state, host_id = p.hid, reservation_id = p.rid, queued_at = p.qat,
      parked_at = p.pat, updated_at = p.uat
    from jsonb_to_recordset(${rows}::jsonb) as p(id text, state text, hid text, rid text, qat bigint, pat bigint, uat bigint)
    where sessions.id = p.id`)
}
