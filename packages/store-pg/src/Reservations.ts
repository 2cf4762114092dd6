/**
 * The reservation ledger (SPEC §3): admission (core's `Ledger.admit` under the host's lock),
 * release, heartbeats, reclaim (core's `Reclaim.decide` over the locked entries, sessions and
 * moves), summaries and the cumulative metrics. Reservations, releases and reclaims are plans
 * the apply writes; heartbeats only renew a time.
 */
import { randomUUID } from "node:crypto"
import { Ledger, Order, Reclaim } from "@engram/core"
import type { LedgerEntry, Session } from "@engram/core"
import { Conflict, CurrentFence, Cursor, NotFound, Refused, Validate } from "@engram/store"
import type { Fence, ReclaimResult, Reservation, ReserveInput, StoreShape } from "@engram/store"
import { and, asc, eq, gt, lt, or, sql } from "drizzle-orm"
import { Effect } from "effect"
import { apply } from "./Apply.js"
import * as Batcher from "./Batcher.js"
import { anyJson, dieOnUnique, RunAgain } from "./Db.js"
import type { Conn, DbError, Tx } from "./Db.js"
import type { Deps } from "./Deps.js"
import { readHostRows, toCandidate } from "./HostRows.js"
import type { HostRow } from "./HostRows.js"
import { lockHosts } from "./Locks.js"
import * as FenceSql from "./Fence.js"
import * as Pages from "./Pages.js"
import { toMove, toReservation, toSession } from "./Rows.js"
import type { ReservationRow } from "./Rows.js"
import { hosts, moves, reservations, sessions } from "./schema.js"

type ReservationOps = Pick<
  StoreShape,
  | "reserve"
  | "release"
  | "heartbeat"
  | "heartbeatHost"
  | "getReservation"
  | "pageReservations"
  | "reclaim"
  | "clusterSummary"
  | "metrics"
>


/** Counts one refused `reserve()` in this backend's shard of the metrics (after its transaction rolled back). */
const countReserveFailure = (conn: Conn) =>
  dieOnUnique(
    conn.query(sql`insert into metrics (shard, reserve_failures) values (pg_backend_pid() % 64, 1)
      on conflict (shard) do update set reserve_failures = metrics.reserve_failures + 1`),
  )

/** How heartbeats and reports from many agents are grouped into statements. */
export interface BeatOptions {
  /**
   * How long (real ms) a group of heartbeats (or host reports) gathers after its first one
   * before it is written (default 0: what arrives together, or while a group is written).
   */
  readonly beatWindowMs?: number | undefined
  /** At most this many heartbeats (or reports) per statement (default 512). */
  readonly beatBatchSize?: number | undefined
  /** See `StorePg.StoreOptions.groupHoldBoundMs`. */
  readonly holdBoundMs?: number | undefined
}

/** The batcher options of heartbeats and reports. */
export const beatBatching = (options: BeatOptions) => ({
  maxBatch: Math.max(1, Math.floor(options.beatBatchSize ?? 512)),
  maxInFlight: 1,
  timerMs: Math.max(0, options.beatWindowMs ?? 0),
  holdBoundMs: options.holdBoundMs,
})

/** A reservation row as `toReservation` reads it, from a raw statement over `reservations r`. */
const reservationColumns = sql`r.id, r.host_id as "hostId", r.owner_kind as "ownerKind", r.owner_id as "ownerId", r.mem_mib as "memMib",
  r.vcpus, r.vram_mib as "vramMib", r.created_at::float8 as "createdAt", r.last_heartbeat_at::float8 as "lastHeartbeatAt",
  r.expires_at as "expiresAt", r.description`

/** A heartbeat of one reservation, at `t`. */
interface EntryBeat {
  readonly id: string
  readonly t: number
}

/** A heartbeat of a host (its resident reservations), at `t`. */
interface HostBeat {
  readonly hostId: string
  readonly t: number
}

/**
 * Renews the reservations named, each at its own time, in one statement, the rows locked in id
 * order (the order reclaim locks them in); answers, for each beat in order, its renewed entry
 * (none when the reservation is unknown or already reclaimed).
 */
const renewEntries = <E>(conn: Conn<E>, fence: Fence | null, beats: readonly EntryBeat[]): Effect.Effect<Reservation[][], E> =>
  Effect.map(
    FenceSql.run(
      conn,
      fence,
      [
        sql`with beat as (select * from jsonb_to_recordset(${JSON.stringify(beats)}::jsonb) as b(id text, t bigint))
        update ${reservations} r set last_heartbeat_at = greatest(r.last_heartbeat_at, beat.t) from beat
        where r.id = beat.id and r.id in (select id from ${reservations} where id = any(array(select id from beat)) order by id for update)
        returning ${reservationColumns}`,
      ],
    ),
    (rows) => {
      const byId = new Map(rows.map((r) => [r["id"] as string, toReservation(r as unknown as ReservationRow)]))
      return beats.map((b) => {
        const e = byId.get(b.id)
        return e === undefined ? [] : [e]
      })
    },
  )

/**
 * Renews the reservations resident on each host named (`Ledger.renewedByHost`), each host at
 * its own time, in one statement, the rows locked in id order; answers, for each beat in order,
 * how many it renewed, or undefined when the host is unknown.
 */
const renewHosts = <E>(conn: Conn<E>, fence: Fence | null, beats: readonly HostBeat[]): Effect.Effect<(number | undefined)[], E> =>
  Effect.map(
    FenceSql.run(conn, fence, [
      sql`with beat as (select * from jsonb_to_recordset(${JSON.stringify(beats)}::jsonb) as b("hostId" text, t bigint)),
        renewed as (
          update ${reservations} r set last_heartbeat_at = greatest(r.last_heartbeat_at, beat.t) from beat
          where r.host_id = beat."hostId" and r.id in (select id from ${reservations} where host_id = any(array(select "hostId" from beat))
            and ${anyJson(sql`owner_kind`, Ledger.renewedByHost)}
            order by id for update)
          returning r.host_id
        )
        select h.id as "hostId", (select count(*) from renewed n where n.host_id = h.id)::int as renewed
        from ${hosts} h where h.id = any(array(select "hostId" from beat))`,
    ]),
    (rows) => {
      const renewed = new Map(rows.map((r) => [r["hostId"] as string, Number(r["renewed"])]))
      return beats.map((b) => renewed.get(b.hostId))
    },
  )

/** The ledger operations of the store. */
export const make = ({ db, now, limits, cache, both }: Deps, options: BeatOptions = {}): ReservationOps => {
  // Heartbeats from many agents go in one statement: those that arrive within `beatWindowMs`
  // of the first, up to `beatBatchSize`; two beats of one reservation (or host) go one after
  // the other. A statement renews only rows that exist, so one unknown id fails its own caller
  // alone; a failure of the database fails the group's callers, and the statement is all or
  // nothing.
  const batching = beatBatching(options)
  const renewals = Batcher.make<EntryBeat, Reservation[], DbError>({ ...batching, name: "renewals", keysOf: (b) => [b.id], run: (beats) => renewEntries(db.pool, null, beats) })
  const hostRenewals = Batcher.make<HostBeat, number | undefined, DbError>({ ...batching, name: "hostBeats", keysOf: (b) => [b.hostId], run: (beats) => renewHosts(db.pool, null, beats) })

  const summaryOf = (row: HostRow, entries: readonly LedgerEntry[], t: number): Ledger.HostSummary =>
    Ledger.summarizeHost(row.id, toCandidate(row, limits()).headroom.allocatableMib, entries, t, limits())

  const reserve: StoreShape["reserve"] = (input: ReserveInput) =>
    Effect.gen(function* () {
      const t = yield* now
      const bad = Validate.ownerKind(input.ownerKind) ?? Validate.reserveExtras(input, t)
      if (bad) return yield* bad
      const id = input.id
      const hostId = input.hostId
      const duplicateOf = (tx: Tx) =>
        typeof id === "string" && id !== ""
          ? Effect.map(tx.use((exec) => exec.select({ id: reservations.id }).from(reservations).where(eq(reservations.id, id))), (rows) => rows.length > 0)
          : Effect.succeed(false)
      return yield* db.transaction((tx) =>
        Effect.gen(function* () {
          let duplicate: boolean
          let row: HostRow | undefined
          if (typeof hostId === "string" && hostId !== "") {
            yield* lockHosts(tx, [hostId])
            const [dup, rows] = yield* both(duplicateOf(tx), readHostRows(tx, { hostIds: [hostId] }))
            duplicate = dup
            row = rows[0]
          } else duplicate = yield* duplicateOf(tx)
          const c = row === undefined ? undefined : toCandidate(row, limits())
          const host = row === undefined || c === undefined ? undefined : { state: row.state, measured: c.measured ?? false, headroom: c.headroom, entries: row.entries }
          const admission = Ledger.admit(input, { duplicate, host }, limits())
          if (admission._tag === "Refuse") {
            if (admission.check === "duplicate") return yield* new Conflict({ entity: "reservation", id: String(id), reason: admission.message })
            return yield* new Refused({ check: admission.check, reason: admission.message })
          }
          const plan = Ledger.reservePlan({ ...input, id: id as string, hostId: hostId as string }, (row as HostRow).version, t)
          const [outcome] = yield* apply(tx, cache, [plan])
          if (outcome?._tag !== "Applied") return yield* new RunAgain({ why: "the host changed under its lock" })
          return (plan.ledger[0] as { readonly entry: LedgerEntry }).entry
        }),
      ).pipe(
        Effect.catchTag("UniqueViolation", () =>
          Effect.fail(new Conflict({ entity: "reservation", id: String(input.id), reason: `reservation ${String(input.id)} already exists` })),
        ),
        // Every refusal but the duplicate counts (SPEC §3), also though nothing else is written.
        Effect.tapError((e) => (e._tag === "Refused" ? countReserveFailure(db.pool) : Effect.void)),
      )
    })

  /**
   * The ways back to a move's source that core names for the doomed session entries
   * (`Reclaim.wayBackOf` on each session's newest event, read walking its history's primary key
   * backwards, and the resend mark of the move it names), each with its source's row as read now
   * (no lock: the apply checks its version).
   */
  const waysOf = (tx: Tx, doomed: readonly Reservation[], locked: readonly Session.Record[]) =>
    Effect.gen(function* () {
      const byId = new Map(locked.map((s) => [s.id, s]))
      const running = doomed.flatMap((e) => {
        const s = e.ownerKind === "session" ? byId.get(e.ownerId) : undefined
        return s !== undefined && s.state === "running" && s.reservationId === e.id ? [{ e, s }] : []
      })
      if (running.length === 0) return []
      const lastRows = yield* tx.query<{ session_id: string; event: Session.Event }>(
        sql`select s.id as session_id, (select e.event from session_events e where e.session_id = s.id order by e.seq desc limit 1) as event
            from sessions s where ${anyJson(sql`s.id`, running.map((r) => r.s.id))}`,
      )
      const lastOf = new Map(lastRows.map((r) => [r.session_id, r.event]))
      // The moves those events name, with their source's resend mark (`markResendOwed`, written
      // under the session's row lock, which this pass holds).
      const movedIds = [...new Set(lastRows.flatMap((r) => (r.event?._tag === "Moved" ? [r.event.moveId] : [])))].sort()
      if (movedIds.length === 0) return []
      const markRows = yield* tx.query<{ id: string; resend_owed: boolean }>(sql`select m.id, m.resend_owed from moves m where ${anyJson(sql`m.id`, movedIds)}`)
      const owedOf = new Map(markRows.map((r) => [r.id, r.resend_owed]))
      const wanted = running.flatMap(({ e, s }) => {
        const lastEvent = lastOf.get(s.id) ?? undefined
        const owed = lastEvent?._tag === "Moved" ? owedOf.get(lastEvent.moveId) : undefined
        const lastMove = lastEvent?._tag === "Moved" && owed !== undefined ? { id: lastEvent.moveId, resendOwed: owed } : undefined
        const sourceId = Reclaim.wayBackOf(s, e, lastEvent, lastMove)
        return sourceId === null || lastEvent === undefined || lastMove === undefined ? [] : [{ sessionId: s.id, lastEvent, lastMove, sourceId }]
      })
      if (wanted.length === 0) return []
      const rows = new Map((yield* readHostRows(tx, { hostIds: [...new Set(wanted.map((w) => w.sourceId))].sort(), columns: "room" })).map((r) => [r.id, r]))
      return wanted.flatMap((w): Reclaim.Way[] => {
        const row = rows.get(w.sourceId)
        return row === undefined ? [] : [{ sessionId: w.sessionId, lastEvent: w.lastEvent, lastMove: w.lastMove, source: toCandidate(row, limits()), version: row.version, reservationId: randomUUID() }]
      })
    })

  const reclaim: StoreShape["reclaim"] = (options = {}) =>
    Effect.gen(function* () {
      const t = yield* now
      return yield* db.transaction((tx) =>
        Effect.gen(function* () {
          // Liveness is core's rule (with the caller's options: only the expired while the
          // failover grace holds): read the figures it needs (no lock), let it judge, then lock
          // what the pass may touch in the one lock order of the store — sessions, moves,
          // reservations (the apply locks the hosts) — and judge again. The first read takes
          // only the entries past core's cutoffs (the table is read on the server, the live
          // entries never shipped): every pass read the whole ledger before.
          const cut = Ledger.reclaimCutoffs(t, limits(), options)
          const expired = lt(reservations.expiresAt, cut.expiredBefore)
          // A bigint column: below the cutoff rounded up takes every entry below the cutoff (core judges them).
          const past = cut.staleBefore === null ? expired : or(expired, lt(reservations.lastHeartbeatAt, Math.ceil(cut.staleBefore)))
          const all = yield* tx.use((exec) =>
            exec
              .select({
                id: reservations.id,
                expiresAt: reservations.expiresAt,
                lastHeartbeatAt: reservations.lastHeartbeatAt,
                ownerKind: reservations.ownerKind,
                ownerId: reservations.ownerId,
              })
              .from(reservations)
              .where(past),
          )
          const suspects = Ledger.reclaimable(all, t, limits(), options)
          if (suspects.length === 0) return { reclaimed: [], lostSessions: [], closedMoves: [], imageHostIds: [] } satisfies ReclaimResult
          const ownerIds = (kind: string) => [...new Set(suspects.filter((e) => e.ownerKind === kind).map((e) => e.ownerId))].sort()
          const moveOwners = ownerIds("move")
          const movesSessions =
            moveOwners.length === 0
              ? []
              : (yield* tx.use((exec) => exec.select({ sessionId: moves.sessionId }).from(moves).where(anyJson(moves.id, moveOwners)))).map((m) => m.sessionId)
          const sessionIds = [...new Set([...ownerIds("session"), ...movesSessions])].sort()
          const sessionRows =
            sessionIds.length === 0
              ? []
              : yield* tx.use((exec) => exec.select().from(sessions).where(anyJson(sessions.id, sessionIds)).orderBy(sessions.id).for("update"))
          const lockedSessions = new Set(sessionRows.map((r) => r.id))
          const moveRows =
            sessionIds.length + moveOwners.length === 0
              ? []
              : yield* tx.use((exec) =>
                  exec
                    .select()
                    .from(moves)
                    .where(and(eq(moves.state, "pending"), sql`(${anyJson(moves.id, moveOwners)} or ${anyJson(moves.sessionId, sessionIds)})`))
                    .orderBy(moves.id)
                    .for("update"),
                )
          const lockedMoves = new Set(moveRows.map((m) => m.id))
          const locked = yield* tx.use((exec) =>
            exec
              .select()
              .from(reservations)
              .where(anyJson(reservations.id, suspects.map((e) => e.id)))
              .orderBy(reservations.id)
              .for("update"),
          )
          const wanted = Reclaim.wanted(locked.map(toReservation), t, limits(), options)
          // An entry changed hands after the first read (a commit gives a move's entry to its
          // session): read again, with the locks this pass needs.
          if (wanted.sessionIds.some((id) => !lockedSessions.has(id)) || wanted.moveIds.some((id) => !lockedMoves.has(id)))
            return yield* new RunAgain({ why: "an entry changed hands" })
          if (wanted.doomed.length === 0) return { reclaimed: [], lostSessions: [], closedMoves: [], imageHostIds: [] } satisfies ReclaimResult
          const ways = yield* waysOf(tx, wanted.doomed, sessionRows.map(toSession))
          const decided = Reclaim.decide({ entries: wanted.doomed, sessions: sessionRows.map(toSession), openMoves: moveRows.map(toMove), ways }, t, limits(), options)
          // Only entries held for in-doubt moves: nothing to write.
          if (decided.reclaimed.length === 0) return { reclaimed: [], lostSessions: [], closedMoves: [], imageHostIds: [] } satisfies ReclaimResult
          const outcomes = yield* apply(tx, cache, [decided.plan, ...decided.returned.map((r) => r.plan)])
          // A session changed under its lock, or a source's room since its row was read (a return's host version).
          if (outcomes.some((o) => o._tag !== "Applied")) return yield* new RunAgain({ why: "a session or a source's room changed under the reclaim" })
          return {
            reclaimed: [...decided.reclaimed].sort(Order.byId),
            lostSessions: [...decided.lostSessions],
            closedMoves: [...decided.closedMoves],
            imageHostIds: [...decided.imageHostIds],
            ...(decided.returned.length === 0 ? {} : { returned: decided.returned.map((r) => ({ sessionId: r.sessionId, hostId: r.hostId })) }),
          } satisfies ReclaimResult
        }),
      )
    }).pipe(dieOnUnique)

  return {
    reserve,

    release: (id) =>
      Effect.gen(function* () {
        const t = yield* now
        return yield* db.transaction((tx) =>
          Effect.gen(function* () {
            const [e] = yield* tx.use((exec) => exec.select().from(reservations).where(eq(reservations.id, id)).for("update"))
            if (e === undefined) return yield* new NotFound({ entity: "reservation", id })
            const owned = Ledger.refuseRelease(e)
            if (owned) return yield* new Refused({ check: owned.check, reason: owned.message })
            const entry = toReservation(e)
            yield* apply(tx, cache, [Ledger.releasePlan(entry, t)])
            return entry
          }),
        )
      }).pipe(dieOnUnique),

    heartbeat: (id) =>
      Effect.gen(function* () {
        const fence = yield* Effect.service(CurrentFence)
        const t = yield* now
        // A write under a lease runs alone, in a transaction behind its own fence check.
        const [row] = fence === null ? yield* renewals({ id, t }) : (yield* db.transaction((tx) => renewEntries(tx, fence, [{ id, t }])))[0] ?? []
        if (row === undefined) return yield* new NotFound({ entity: "reservation", id })
        return row
      }).pipe(dieOnUnique),

    heartbeatHost: (hostId) =>
      Effect.gen(function* () {
        const fence = yield* Effect.service(CurrentFence)
        const t = yield* now
        const answer = fence === null ? yield* hostRenewals({ hostId, t }) : (yield* db.transaction((tx) => renewHosts(tx, fence, [{ hostId, t }])))[0]
        if (answer === undefined) return yield* new NotFound({ entity: "host", id: hostId })
        return answer
      }).pipe(dieOnUnique),

    getReservation: (id) =>
      Effect.flatMap(
        db.pool.use((exec) => exec.select().from(reservations).where(eq(reservations.id, id))),
        (rows) => (rows[0] === undefined ? Effect.fail(new NotFound({ entity: "reservation", id })) : Effect.succeed(toReservation(rows[0]))),
      ).pipe(dieOnUnique),

    pageReservations: (filter = {}, page) =>
      Effect.gen(function* () {
        const bad = Validate.filter("hostId", filter.hostId)
        if (bad) return yield* bad
        const { after, limit } = yield* Pages.check("reservations", page)
        const rows = yield* db.pool.use((exec) =>
          exec
            .select()
            .from(reservations)
            .where(
              and(
                filter.hostId === undefined ? undefined : eq(reservations.hostId, filter.hostId),
                after === undefined ? undefined : gt(reservations.id, after[0]),
              ),
            )
            .orderBy(asc(reservations.id))
            .limit(limit + 1),
        )
        return Cursor.pageOf("reservations", rows.map(toReservation), (e) => [e.id], limit)
      }).pipe(dieOnUnique),

    reclaim,

    clusterSummary: () =>
      Effect.gen(function* () {
        const t = yield* now
        const [rows, entries] = yield* db.transaction((tx) => both(readHostRows(tx), tx.use((exec) => exec.select().from(reservations))))
        const byHost = new Map<string, LedgerEntry[]>()
        for (const e of entries) {
          const list = byHost.get(e.hostId)
          if (list === undefined) byHost.set(e.hostId, [toReservation(e)])
          else list.push(toReservation(e))
        }
        return Ledger.summarizeCluster(rows.map((r) => summaryOf(r, byHost.get(r.id) ?? [], t)))
      }).pipe(dieOnUnique),

    metrics: () =>
      Effect.map(
        db.pool.query(
          sql`select
            coalesce((select sum(total_reserved_mib) from metrics), 0)::float8 as "totalReservedMib",
            coalesce((select sum(total_released_mib) from metrics), 0)::float8 as "totalReleasedMib",
            coalesce((select sum(total_reclaimed_mib) from metrics), 0)::float8 as "totalReclaimedMib",
            coalesce((select sum(reserve_failures) from metrics), 0)::float8 as "reserveFailures",
            (select count(*) from reservations)::float8 as "activeEntries"`,
        ),
        (rows): Ledger.Metrics => {
          const r = rows[0] ?? {}
          return {
            totalReservedMib: Number(r["totalReservedMib"] ?? 0),
            totalReleasedMib: Number(r["totalReleasedMib"] ?? 0),
            totalReclaimedMib: Number(r["totalReclaimedMib"] ?? 0),
            reserveFailures: Number(r["reserveFailures"] ?? 0),
            activeEntries: Number(r["activeEntries"] ?? 0),
          }
        },
      ).pipe(dieOnUnique),
  }
}
