/**
 * The engram store on PostgreSQL (postgres.js) and on PGlite, through drizzle-orm: one
 * implementation, one query path, two drivers. Every operation is one transaction (nothing
 * partial is ever written); every decision about room, admission and state calls
 * `@engram/core`; time comes from the Effect Clock.
 */
import { randomUUID } from "node:crypto"
import { PGlite } from "@electric-sql/pglite"
import { Ledger, Limits, Placement, PlacementIndex, Session as SessionRules } from "@engram/core"
import type { Budget, FleetHost, LedgerEntry, Queued, SessionState } from "@engram/core"
import {
  Conflict,
  IllegalTransition,
  InvalidInput,
  NotFound,
  Refused,
  Store,
  StoreTesting,
  Unavailable,
  Validate,
} from "@engram/store"
import type {
  DrainResult,
  FleetRead,
  Host,
  HostView,
  Move,
  MoveRound,
  PlaceOutcome,
  ReclaimResult,
  Reservation,
  ReserveInput,
  Session,
  SessionFilter,
  StoreShape,
  StoreTestingShape,
} from "@engram/store"
import { and, asc, eq, inArray, or, sql } from "drizzle-orm"
import type { SQL } from "drizzle-orm"
import { drizzle as drizzlePglite } from "drizzle-orm/pglite"
import { drizzle as drizzlePostgres } from "drizzle-orm/postgres-js"
import { Cause, Clock, Context, Effect, Exit, Layer } from "effect"
import postgres from "postgres"
import { makeDb, makePostgresDb, query, retryAfterMs } from "./Db.js"
import type { Db, DbError, Exec } from "./Db.js"
import { migratePgliteClient, migrateUrl } from "./Migrate.js"
import {
  inJson,
  insertEntry,
  lockHosts,
  lockMove,
  lockOpenMove,
  lockSession,
  pickAndLock,
  queuePosition,
  removeEntries,
  countReserveFailure,
  bumpMetricSql,
  hostSumsSql,
  toMove,
  toReservation,
  toSession,
} from "./Ops.js"
import type { MoveRow, SessionRow } from "./Ops.js"
import { readRoom, readSumsDrift, roomChangedSql, roomColumns, roomSql, toCandidate, toHostView, toRoomRow } from "./Room.js"
import type { RoomRow, SumsDrift } from "./Room.js"
import { hosts, moves, reservations, sessions } from "./schema.js"

// ---- transaction outcomes --------------------------------------------------------------------

/** What a transaction body decided: a value, a typed refusal (nothing written), or "run me again". */
type Out<A, E> =
  | { readonly _tag: "Ok"; readonly value: A }
  | { readonly _tag: "Err"; readonly error: E }
  | { readonly _tag: "Retry" }

const ok = <A>(value: A): Out<A, never> => ({ _tag: "Ok", value })
const err = <E>(error: E): Out<never, E> => ({ _tag: "Err", error })
const retry: Out<never, never> = { _tag: "Retry" }

const maxRetries = 10

const byId = (a: { readonly id: string }, b: { readonly id: string }): number => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)

const jsonList = (values: readonly string[]): SQL => sql`(select jsonb_array_elements_text(${JSON.stringify(values)}::jsonb))`

/** Options of a store on a PostgreSQL URL. */
export interface PgOptions {
  /** `postgres://user:pass@host:port/db` */
  readonly url: string
  /** Decision limits (default `Limits.defaults`). */
  readonly limits?: Limits.Limits | undefined
  /** Connections in the pool (default 10). */
  readonly poolSize?: number | undefined
  /** Seconds to wait for a connection before answering `Unavailable` (default 5). */
  readonly connectTimeoutSec?: number | undefined
  /** Apply the migrations at start (default true). */
  readonly migrate?: boolean | undefined
  /** See {@link StoreOptions.placementReadMaxAgeMs}. */
  readonly placementReadMaxAgeMs?: number | undefined
  /** See {@link StoreOptions.optimisticPlacementAttempts}. */
  readonly optimisticPlacementAttempts?: number | undefined
}

/** Tuning of the store itself. */
export interface StoreOptions {
  /**
   * How old (real ms) the fleet read a placement ranks from may be; 0 (the default) reads
   * the room of every host afresh for every placement (a read that starts after the call;
   * concurrent placements share it). Above 0, placements reuse the last read, kept up to
   * date with this store's own placements (every other write drops it): the choice may then
   * miss another replica's last changes, never the safety, which comes from the version the
   * write checks. A placement finds no fit, and queues, only on a fresh read.
   */
  readonly placementReadMaxAgeMs?: number | undefined
  /**
   * How many times a new session's optimistic placement may lose its host to a concurrent
   * write (and decide again) before it falls back to the locking path (default 8; 0: always
   * the locking path).
   */
  readonly optimisticPlacementAttempts?: number | undefined
}

/** Options of a store on PGlite. */
export interface PgliteOptions {
  /** A data directory that survives restarts; in memory when absent. */
  readonly dataDir?: string | undefined
  readonly limits?: Limits.Limits | undefined
  readonly placementReadMaxAgeMs?: number | undefined
  readonly optimisticPlacementAttempts?: number | undefined
}

/** A store with its test reset. */
export interface StorePair {
  readonly store: StoreShape
  readonly testing: StoreTestingShape
  /** The hosts whose maintained sums differ from the ledger (`host_reserved_sums`): empty when consistent. */
  readonly sumsDrift: Effect.Effect<readonly SumsDrift[], Unavailable>
}

/** Builds the store over an open database. */
export const make = (db: Db, initialLimits: Limits.Limits = Limits.defaults, options: StoreOptions = {}): StorePair => {
  let limits = initialLimits
  const maxReadAgeMs = options.placementReadMaxAgeMs ?? 0
  // Committed host rows this store has seen (a full read, a placement's answer, a re-read
  // of a host), the newest version of each, with core's candidate for it; `knownAt` is when
  // the last full read ran (real time, not the Clock). A row read inside a transaction that
  // may still roll back is never kept: a version seen only there may be reused.
  interface Known {
    readonly row: RoomRow
    readonly candidate: FleetHost
  }
  // Hosts a placement of this store is writing to right now (see `chooseHost`).
  const inflight = new Map<string, number>()
  let known = new Map<string, Known>()
  // Core's placement index over the known hosts (`all`), and over those no placement of this
  // store is writing to right now (`free`, see `chooseHost`): picks in O(log n).
  let allIndex = new PlacementIndex.Index(limits)
  let freeIndex = new PlacementIndex.Index(limits)
  // Bumped by a test reset: a read that started before it must not fill `known` after it.
  let generation = 0
  let knownAt = Number.NEGATIVE_INFINITY
  const learn = (row: RoomRow): void => {
    const k = known.get(row.id)
    if (k !== undefined && row.version < k.row.version) return
    const candidate = toCandidate(row, limits)
    known.set(row.id, { row, candidate })
    allIndex.upsert(candidate)
    if (!inflight.has(row.id)) freeIndex.upsert(candidate)
  }
  const unlearn = (id: string): void => {
    known.delete(id)
    allIndex.remove(id)
    freeIndex.remove(id)
  }
  const learnAll = (rows: readonly RoomRow[]): void => {
    const seen = new Set<string>()
    for (const r of rows) {
      seen.add(r.id)
      learn(r)
    }
    for (const id of [...known.keys()]) if (!seen.has(id)) unlearn(id)
    knownAt = performance.now()
  }
  const forgetKnown = (): void => {
    known = new Map()
    allIndex = new PlacementIndex.Index(limits)
    freeIndex = new PlacementIndex.Index(limits)
    generation++
  }
  const knownIsRecent = (): boolean => maxReadAgeMs > 0 && performance.now() - knownAt <= maxReadAgeMs
  const forgetRoom = (): void => {
    knownAt = Number.NEGATIVE_INFINITY
  }
  const now = Clock.currentTimeMillis
  const parallel = db.driver === "postgres"
  // postgres.js pipelines concurrent queries of one transaction; PGlite runs them one by one.
  const both = async <A, B>(a: () => Promise<A>, b: () => Promise<B>): Promise<[A, B]> =>
    parallel ? Promise.all([a(), b()]) : [await a(), await b()]

  /** Runs a transaction body until it decides (re-running it on `Retry`). */
  const op = <A, E>(
    body: (tx: Exec, attempt: number) => Promise<Out<A, E>>,
    onUnique?: (constraint: string) => E,
    keepsRoom = false,
  ): Effect.Effect<A, E | Unavailable> => {
    // Any write but a create's own placement may change room: drop the placement read.
    const body_ = keepsRoom
      ? body
      : async (tx: Exec, attempt: number) => {
          forgetRoom()
          try {
            return await body(tx, attempt)
          } finally {
            forgetRoom()
          }
        }
    const loop = (attempt: number): Effect.Effect<A, E | Unavailable> =>
      db.tx((tx) => body_(tx, attempt)).pipe(
        Effect.catchTag("UniqueViolation", (u): Effect.Effect<never, E | Unavailable> =>
          onUnique === undefined
            ? Effect.die(new Error(`unexpected unique violation of ${u.constraint}`))
            : Effect.fail(onUnique(u.constraint)),
        ),
        Effect.flatMap((out): Effect.Effect<A, E | Unavailable> => {
          if (out._tag === "Ok") return Effect.succeed(out.value)
          if (out._tag === "Err") return Effect.fail(out.error)
          if (attempt + 1 >= maxRetries)
            return Effect.fail(new Unavailable({ reason: "kept losing races; retry", retryAfterMs }))
          return loop(attempt + 1)
        }),
      )
    return loop(0)
  }

  /** A read outside a transaction (one statement). */
  const read = <A>(body: (exec: Exec) => Promise<A>): Effect.Effect<A, Unavailable> =>
    db.run(body).pipe(Effect.catchTag("UniqueViolation", (u: DbError) => Effect.die(u)))

  const illegal = (s: { readonly id: string; readonly state: string }, to: SessionState): IllegalTransition | null => {
    const t = SessionRules.transition(s.state as SessionState, to)
    return t._tag === "Legal" ? null : new IllegalTransition({ sessionId: s.id, from: s.state, to, reason: t.message })
  }
  /** A store operation judged by core: its own start states, then the life cycle (`Session.apply`). */
  const refusedOp = (
    s: { readonly id: string; readonly state: string },
    operation: SessionRules.Operation,
    to: SessionState,
  ): IllegalTransition | null => {
    const t = SessionRules.apply(operation, s.state as SessionState, to)
    return t._tag === "Legal" ? null : new IllegalTransition({ sessionId: s.id, from: s.state, to, reason: t.message })
  }
  const sessionNotFound = (id: string) => new NotFound({ entity: "session", id })
  const hostNotFound = (id: string) => new NotFound({ entity: "host", id })
  const moveNotFound = (id: string) => new NotFound({ entity: "move", id })

  // ---- hosts ---------------------------------------------------------------------------------

  const hostView = async (exec: Exec, id: string): Promise<HostView | undefined> => {
    const row = (await readRoom(exec, { hostIds: [id], sessions: "counts" }))[0]
    return row === undefined ? undefined : toHostView(row, limits)
  }

  // ---- sessions --------------------------------------------------------------------------------

  const candidatesOf = (rows: readonly RoomRow[]): FleetHost[] => rows.map((r) => toCandidate(r, limits))

  /** The outcome of a session as it is now (a repeated create, or after a placement). */
  const outcomeOf = async (tx: Exec, s: Session, rows: readonly RoomRow[] | null): Promise<PlaceOutcome> => {
    if (s.hostId !== null) return { _tag: "Placed", session: s }
    const room = rows ?? (await readRoom(tx))
    const position = s.state === "queued" ? await queuePosition(tx, s) : 0
    return {
      _tag: "Queued",
      session: s,
      position,
      noFit: Placement.noFit(candidatesOf(room), { budget: s.budget, affinity: s.affinity }, limits),
    }
  }

  const insertSessionSql = (s: Session): SQL => sql`insert into sessions
      (id, state, mem_mib, vcpus, affinity, host_id, reservation_id, queued_at, parked_at, created_at, updated_at)
    values (${s.id}, ${s.state}, ${s.budget.memMib}, ${s.budget.vcpus},
      array(select jsonb_array_elements_text(${JSON.stringify(s.affinity)}::jsonb)),
      ${s.hostId}, ${s.reservationId}, ${s.queuedAt}, ${s.parkedAt}, ${s.createdAt}, ${s.updatedAt})
    on conflict (id) do nothing
    returning id`

  // ---- placement of a new session: optimistic, one statement ---------------------------------

  /** How many times a placement re-decides after losing its host to a concurrent write. */
  const maxCasAttempts = options.optimisticPlacementAttempts ?? 8

  /**
   * Core's choice among the known hosts. Hosts another placement of this store is writing to
   * right now are left out while any other host fits (the in-process analogue of `SKIP
   * LOCKED`: that host is about to change, and a concurrent write to it would lose its
   * version race); a host the request names in its affinity is never left out.
   */
  const chooseHost = (req: Placement.Request): string | null => {
    if (inflight.size === 0 || (req.affinity?.length ?? 0) > 0) return allIndex.pick(req)
    return freeIndex.pick(req) ?? allIndex.pick(req)
  }

  type PlaceAnswer =
    | { readonly _tag: "Placed"; readonly row: RoomRow }
    | { readonly _tag: "Lost" }
    | { readonly _tag: "Exists" }

  /**
   * The placement write: one statement (autocommit: one round trip) for one placement or for
   * several concurrent ones of this store (`p`, one row each, never two on the same host or
   * with the same session id). For each, it adds the budget to the chosen host's sums only if
   * the host row is still at the version core decided on and the session does not exist, then
   * inserts the session and its reservation from that update, and counts the metric. No fit
   * rule here: core judged exactly the row at `v`. A concurrent create of the same id elsewhere
   * makes a session insert a unique violation, which undoes the whole statement.
   */
  const placeSql = (batch: unknown): SQL => sql`with p as (
      select * from jsonb_to_recordset(${batch}::jsonb)
        as p(sid text, hid text, v bigint, rid text, mem float8, vcpus float8, aff jsonb, t bigint)
    ), e as (
      select sessions.id from sessions join p on sessions.id = p.sid
    ), h as (
      update hosts set
        reserved_mem_mib = hosts.reserved_mem_mib + p.mem::numeric,
        reserved_vcpus = hosts.reserved_vcpus + p.vcpus::numeric,
        entries = hosts.entries + 1,
        version = hosts.version + 1
      from p
      where hosts.id = p.hid and hosts.version = p.v and not exists (select 1 from e where e.id = p.sid)
      returning p.sid as "sid", ${roomColumns("hosts", "room")}
    ), s as (
      insert into sessions (id, state, mem_mib, vcpus, affinity, host_id, reservation_id, queued_at, parked_at, created_at, updated_at)
      select p.sid, 'pending', p.mem::bigint, p.vcpus::bigint, array(select jsonb_array_elements_text(p.aff)),
        p.hid, p.rid, null, null, p.t, p.t
      from p join h on h.sid = p.sid
      returning id
    ), r as (
      insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, created_at, last_heartbeat_at)
      select p.rid, p.hid, 'session', s.id, p.mem, p.vcpus, p.t, p.t from p join s on s.id = p.sid
      returning mem_mib
    ), m as (${bumpMetricSql("total_reserved_mib", sql`sum(mem_mib)`, sql`r`)})
    select p.sid as "placeSid", (select count(*)::int from e where e.id = p.sid) as "exists",
      (select count(*)::int from s where s.id = p.sid) as "placed", h.*
    from p left join h on h.sid = p.sid`
  // On postgres.js the statement is built once; the batch travels as its one parameter.
  const placeCompiled = db.compile?.(placeSql(sql.placeholder("batch"))) ?? null

  interface PlaceItem {
    readonly s: Session
    readonly host: RoomRow
    readonly done: (exit: Exit.Exit<PlaceAnswer, Unavailable>) => void
  }
  /** At most this many placements per statement, and this many statements in flight. */
  const maxBatch = 64
  const maxBatchesInFlight = 2
  let waiting: PlaceItem[] = []
  let batchesInFlight = 0

  const runBatch = (batch: readonly PlaceItem[]): Effect.Effect<Map<string, PlaceAnswer>, DbError> => {
    const json = JSON.stringify(
      batch.map((i) => ({
        sid: i.s.id,
        hid: i.host.id,
        v: i.host.version,
        rid: i.s.reservationId,
        mem: i.s.budget.memMib,
        vcpus: i.s.budget.vcpus,
        aff: i.s.affinity,
        t: i.s.createdAt,
      })),
    )
    const run =
      placeCompiled === null
        ? db.run((exec) => query<Record<string, unknown>>(exec, placeSql(json)))
        : db.run(() => placeCompiled({ batch: json }))
    return Effect.map(run, (rows) => {
      const out = new Map<string, PlaceAnswer>()
      for (const r of rows) {
        const sid = r["placeSid"] as string
        if (Number(r["placed"] ?? 0) > 0) out.set(sid, { _tag: "Placed", row: toRoomRow(r) })
        else out.set(sid, Number(r["exists"] ?? 0) > 0 ? { _tag: "Exists" } : { _tag: "Lost" })
      }
      return out
    })
  }

  /**
   * Sends what waits, as long as fewer than `maxBatchesInFlight` statements are out: alone
   * when nothing else is in flight (one round trip), together with the placements that queued
   * up behind the statements in flight otherwise. A batch whose statement hit a unique
   * violation (a session id created concurrently elsewhere) wrote nothing: its placements are
   * sent again one by one, so only that one answers `Exists`.
   */
  const pump = (): void => {
    while (batchesInFlight < maxBatchesInFlight && waiting.length > 0) {
      const batch: PlaceItem[] = []
      const rest: PlaceItem[] = []
      const hostsIn = new Set<string>()
      const sessionsIn = new Set<string>()
      for (const item of waiting) {
        if (batch.length < maxBatch && !hostsIn.has(item.host.id) && !sessionsIn.has(item.s.id)) {
          batch.push(item)
          hostsIn.add(item.host.id)
          sessionsIn.add(item.s.id)
        } else rest.push(item)
      }
      waiting = rest
      batchesInFlight++
      void Effect.runPromiseExit(runBatch(batch)).then((exit) => {
        batchesInFlight--
        if (Exit.isSuccess(exit)) {
          for (const item of batch) item.done(Exit.succeed(exit.value.get(item.s.id) ?? { _tag: "Lost" }))
        } else {
          const unique = exit.cause.reasons.some((r) => r._tag === "Fail" && r.error._tag === "UniqueViolation")
          if (unique && batch.length > 1) {
            // Again, one statement each.
            for (const item of batch) solo.push(item)
          } else if (unique) {
            ;(batch[0] as PlaceItem).done(Exit.succeed({ _tag: "Exists" }))
          } else {
            const failure = Exit.failCause(
              Cause.map(exit.cause, (e) =>
                e._tag === "UniqueViolation" ? new Unavailable({ reason: "unexpected unique violation", retryAfterMs }) : e,
              ),
            )
            for (const item of batch) item.done(failure)
          }
        }
        pumpSolo()
        pump()
      })
    }
  }
  // Placements to send alone (after their batch hit a unique violation), one statement each.
  const solo: PlaceItem[] = []
  const pumpSolo = (): void => {
    while (solo.length > 0) {
      const item = solo.shift() as PlaceItem
      void Effect.runPromiseExit(runBatch([item])).then((exit) => {
        if (Exit.isSuccess(exit)) item.done(Exit.succeed(exit.value.get(item.s.id) ?? { _tag: "Lost" }))
        else if (exit.cause.reasons.some((r) => r._tag === "Fail" && r.error._tag === "UniqueViolation"))
          item.done(Exit.succeed({ _tag: "Exists" }))
        else
          item.done(
            Exit.failCause(
              Cause.map(exit.cause, (e) =>
                e._tag === "UniqueViolation" ? new Unavailable({ reason: "unexpected unique violation", retryAfterMs }) : e,
              ),
            ),
          )
      })
    }
  }

  const placeOn = (s: Session, host: RoomRow): Effect.Effect<PlaceAnswer, Unavailable> => {
    const writers = inflight.get(host.id) ?? 0
    inflight.set(host.id, writers + 1)
    if (writers === 0) freeIndex.remove(host.id)
    return Effect.promise(
      () =>
        new Promise<Exit.Exit<PlaceAnswer, Unavailable>>((resolve) => {
          waiting.push({ s, host, done: resolve })
          pump()
        }),
    ).pipe(
      Effect.flatMap((exit) => exit),
      Effect.ensuring(
        Effect.sync(() => {
          const n = (inflight.get(host.id) ?? 1) - 1
          if (n > 0) inflight.set(host.id, n)
          else {
            inflight.delete(host.id)
            const k = known.get(host.id)
            if (k !== undefined) freeIndex.upsert(k.candidate)
          }
        }),
      ),
    )
  }

  /** Every host's room, read afresh (no transaction, no lock): the maintained sums, no aggregation. */
  const readAllOnce: Effect.Effect<void, Unavailable> = Effect.suspend(() => {
    const gen = generation
    if (known.size === 0)
      return Effect.map(read((exec) => readRoom(exec, { columns: "room" })), (rows) => {
        if (gen === generation) learnAll(rows)
      })
    // Only the hosts whose version changed since we knew them (a host at the same version is
    // the same row): as fresh as a full read, with less to send and decode.
    const versions: Record<string, number> = {}
    for (const [id, k] of known) versions[id] = k.row.version
    const startedAt = performance.now()
    return Effect.map(
      read((exec) => query<Record<string, unknown>>(exec, roomChangedSql(versions))),
      (rows) => {
        if (gen !== generation) return
        for (const r of rows) learn(toRoomRow(r))
        knownAt = startedAt
      },
    )
  })
  // Full reads are shared: a placement joins a read that started at or after the moment it
  // needs fresh figures from (`since`, real time), or the one queued behind the read in flight.
  // So concurrent placements cause one read per round trip, not one each.
  interface SharedRead {
    readonly startedAt: number
    readonly done: Promise<Exit.Exit<void, Unavailable>>
  }
  let inFlightRead: SharedRead | null = null
  let queuedRead: Promise<Exit.Exit<void, Unavailable>> | null = null
  const startRead = (): SharedRead => {
    const startedAt = performance.now()
    const done = Effect.runPromiseExit(readAllOnce)
    const shared: SharedRead = { startedAt, done }
    inFlightRead = shared
    void done.then(() => {
      if (inFlightRead === shared) inFlightRead = null
    })
    return shared
  }
  const sharedRead = (since: number): Promise<Exit.Exit<void, Unavailable>> => {
    const current = inFlightRead
    if (current === null) return startRead().done
    if (current.startedAt >= since) return current.done
    if (queuedRead === null) {
      queuedRead = current.done.then(() => {
        queuedRead = null
        return startRead().done
      })
    }
    return queuedRead
  }
  const readAll = (since: number): Effect.Effect<void, Unavailable> =>
    Effect.flatMap(
      Effect.promise(() => sharedRead(since)),
      (exit) => (Exit.isSuccess(exit) ? Effect.void : Effect.failCause(exit.cause)),
    )
  const readOne = (id: string): Effect.Effect<void, Unavailable> =>
    Effect.map(read((exec) => readRoom(exec, { hostIds: [id], columns: "room" })), (rows) => {
      if (rows.length === 0) unlearn(id)
      rows.forEach(learn)
    })

  /** The outcome of a create whose id exists: the session as it is now, or a Conflict. */
  const existingOutcome = (id: string, budget: Budget) =>
    op<PlaceOutcome | null, Conflict>(async (tx) => {
      const [existing] = await tx.select().from(sessions).where(eq(sessions.id, id))
      if (existing === undefined) return ok(null)
      if (existing.memMib !== budget.memMib || existing.vcpus !== budget.vcpus)
        return err(new Conflict({ entity: "session", id, reason: "session exists with another budget" }))
      return ok(await outcomeOf(tx, toSession(existing), null))
    }, undefined, true)

  /**
   * Optimistic placement: core decides on the known rows (a recent read, or a fresh one),
   * one statement writes if the chosen host is still at the version decided on. A lost race
   * re-reads that host and decides again; after `maxCasAttempts` the caller falls back to the
   * locking path (null). No fit on a fresh read: the session is queued.
   */
  const createOptimistic = (id: string, req: Placement.Request & { readonly budget: Budget }, affinity: readonly string[], t: number) =>
    Effect.gen(function* () {
      const since = performance.now()
      let fresh = false
      if (!knownIsRecent()) {
        // With a reuse window, any read in flight will do (but it is not fresh for this call);
        // without, one that starts from now.
        yield* readAll(maxReadAgeMs > 0 ? Number.NEGATIVE_INFINITY : since)
        fresh = maxReadAgeMs === 0
      }
      for (let attempt = 0; attempt < maxCasAttempts; attempt++) {
        const hostId = chooseHost(req)
        if (hostId === null) {
          if (!fresh) {
            // A recent read may miss room freed since: no queueing without a fresh read.
            yield* readAll(since)
            fresh = true
            continue
          }
          const s: Session = {
            id,
            state: "queued",
            budget: req.budget,
            affinity: [...affinity],
            hostId: null,
            reservationId: null,
            queuedAt: t,
            parkedAt: null,
            createdAt: t,
            updatedAt: t,
          }
          const [written] = yield* read((exec) =>
            query<{ n: number; ahead: number }>(
              exec,
              sql`with s as (${insertSessionSql(s)})
              select (select count(*)::int from s) as n,
                (select count(*)::int from sessions where state = 'queued'
                  and (queued_at < ${t} or (queued_at = ${t} and id < ${s.id}))) as ahead`,
            ),
          )
          if (Number(written?.n ?? 0) === 0) return yield* existingOutcome(id, req.budget)
          const hostsNow = [...known.values()].map((k) => k.candidate)
          const outcome: PlaceOutcome = {
            _tag: "Queued",
            session: s,
            position: Number(written?.ahead ?? 0) + 1,
            noFit: Placement.noFit(hostsNow, req, limits),
          }
          return outcome
        }
        const host = (known.get(hostId) as Known).row
        const s: Session = {
          id,
          state: "pending",
          budget: req.budget,
          affinity: [...affinity],
          hostId,
          reservationId: randomUUID(),
          queuedAt: null,
          parkedAt: null,
          createdAt: t,
          updatedAt: t,
        }
        const answer = yield* placeOn(s, host)
        if (answer._tag === "Placed") {
          learn(answer.row)
          const outcome: PlaceOutcome = { _tag: "Placed", session: s }
          return outcome
        }
        if (answer._tag === "Exists") return yield* existingOutcome(id, req.budget)
        // Lost the race for this host: its row changed since core decided. Read it again.
        yield* readOne(hostId)
      }
      return null
    })

  const createSession: StoreShape["createSession"] = (input) =>
    Effect.gen(function* () {
      const bad = Validate.sessionInput(input)
      if (bad) return yield* bad
      const t = yield* now
      const budget: Budget = { memMib: input.budget.memMib, vcpus: input.budget.vcpus }
      const affinity = [...(input.affinity ?? [])]
      const req = { budget, affinity }
      if (maxCasAttempts > 0) {
        const optimistic = yield* createOptimistic(input.id, req, affinity, t)
        if (optimistic !== null) return optimistic
      }
      return yield* createLocked(input.id, budget, affinity, t)
    })

  /**
   * The locking placement (the fallback when optimistic attempts keep losing): read room,
   * pick with core, lock the chosen host and re-check it with core under the lock, write.
   */
  const createLocked = (id: string, budget: Budget, affinity: readonly string[], t: number) => {
      const req: Placement.Request = { budget, affinity }
      return op<PlaceOutcome, Conflict>(async (tx) => {
        const existence = () => tx.select().from(sessions).where(eq(sessions.id, id))
        const [found, rows] = await both(existence, () => readRoom(tx, { columns: "room" }))
        const existing = found[0]
        if (existing !== undefined) {
          if (existing.memMib !== budget.memMib || existing.vcpus !== budget.vcpus)
            return err(new Conflict({ entity: "session", id, reason: "session exists with another budget" }))
          return ok(await outcomeOf(tx, toSession(existing), rows))
        }
        const picked = await pickAndLock(tx, req, limits, { rows })
        if (picked._tag === "Chosen") {
          const s: Session = {
            id,
            state: "pending",
            budget,
            affinity: [...affinity],
            hostId: picked.hostId,
            reservationId: randomUUID(),
            queuedAt: null,
            parkedAt: null,
            createdAt: t,
            updatedAt: t,
          }
          const [written] = await query<{ n: number }>(
            tx,
            sql`with s as (${insertSessionSql(s)}),
            r as (
              insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, created_at, last_heartbeat_at)
              select ${s.reservationId}, ${s.hostId}, 'session', s.id, ${budget.memMib}, ${budget.vcpus}, ${t}, ${t} from s
              returning host_id, mem_mib, vcpus
            ), h as (${hostSumsSql("+", sql`r`)}),
            m as (${bumpMetricSql("total_reserved_mib", sql`sum(mem_mib)`, sql`r`)})
            select count(*)::int as n from s`,
          )
          // Another create of the same id won: answer as a repeated create.
          if (Number(written?.n ?? 0) === 0) return retry
          return ok({ _tag: "Placed", session: s })
        }
        const s: Session = {
          id,
          state: "queued",
          budget,
          affinity: [...affinity],
          hostId: null,
          reservationId: null,
          queuedAt: t,
          parkedAt: null,
          createdAt: t,
          updatedAt: t,
        }
        const [written] = await query<{ n: number; ahead: number }>(
          tx,
          sql`with s as (${insertSessionSql(s)})
          select (select count(*)::int from s) as n,
            (select count(*)::int from sessions where state = 'queued'
              and (queued_at < ${t} or (queued_at = ${t} and id < ${s.id}))) as ahead`,
        )
        if (Number(written?.n ?? 0) === 0) return retry
        return ok({
          _tag: "Queued",
          session: s,
          position: Number(written?.ahead ?? 0) + 1,
          noFit: Placement.noFit(picked.hosts, req, limits),
        })
      })
    }

  const updateSession = async (
    tx: Exec,
    id: string,
    set: Partial<typeof sessions.$inferInsert>,
  ): Promise<Session> => {
    const [row] = await tx.update(sessions).set(set).where(eq(sessions.id, id)).returning()
    return toSession(row as SessionRow)
  }

  /** A state change that touches no reservation; `from` pins the state the call applies to. */
  const transitionOnly = (id: string, operation: SessionRules.Operation, to: SessionState) =>
    Effect.gen(function* () {
      const t = yield* now
      return yield* op<Session, NotFound | IllegalTransition>(async (tx) => {
        const s = await lockSession(tx, id)
        if (s === undefined) return err(sessionNotFound(id))
        const bad = refusedOp(s, operation, to)
        if (bad) return err(bad)
        return ok(await updateSession(tx, id, { state: to, parkedAt: to === "parked" ? t : null, updatedAt: t }))
      })
    })

  /** Ends an open move without committing: its target reservation goes, the move is `aborted`. */
  const closeMove = async (tx: Exec, m: MoveRow, reason: string, t: number, how: "released" | "reclaimed", estimateMs: number | null = null) => {
    const removed = await removeEntries(tx, [m.reservationId], how)
    await tx.update(moves).set({ state: "aborted", abortReason: reason, abortEstimateMs: estimateMs, endedAt: t }).where(eq(moves.id, m.id))
    return removed
  }

  const resume: StoreShape["resume"] = (id) =>
    Effect.gen(function* () {
      const t = yield* now
      return yield* op<PlaceOutcome, NotFound | IllegalTransition>(async (tx) => {
        const row = await lockSession(tx, id)
        if (row === undefined) return err(sessionNotFound(id))
        const bad = refusedOp(row, "resume", "pending")
        if (bad) return err(bad)
        const s = toSession(row)
        const req: Placement.Request = { budget: s.budget, affinity: s.affinity }
        const picked = await pickAndLock(tx, req, limits)
        if (picked._tag === "Chosen") {
          const reservationId = randomUUID()
          await insertEntry(tx, {
            id: reservationId,
            hostId: picked.hostId,
            ownerKind: "session",
            ownerId: id,
            memMib: s.budget.memMib,
            vcpus: s.budget.vcpus,
            now: t,
          })
          const placed = await updateSession(tx, id, {
            state: "pending",
            hostId: picked.hostId,
            reservationId,
            queuedAt: null,
            parkedAt: null,
            updatedAt: t,
          })
          return ok({ _tag: "Placed", session: placed })
        }
        const queued = await updateSession(tx, id, {
          state: "queued",
          hostId: null,
          reservationId: null,
          queuedAt: t,
          parkedAt: null,
          updatedAt: t,
        })
        return ok({
          _tag: "Queued",
          session: queued,
          position: await queuePosition(tx, queued),
          noFit: Placement.noFit(picked.hosts, req, limits),
        })
      })
    })

  // ---- the queue -------------------------------------------------------------------------------

  interface Planned {
    readonly sessionId: string
    readonly hostId: string
    readonly budget: Budget
  }

  /** Walks the queue in FIFO order against the headroom, updated by each placement (core's pick). */
  const planDrain = (queued: readonly SessionRow[], candidates: readonly FleetHost[], limit: number): Planned[] => {
    const index = new PlacementIndex.Index(limits)
    const byHost = new Map<string, FleetHost>()
    for (const c of candidates) {
      index.upsert(c)
      byHost.set(c.id, c)
    }
    const plan: Planned[] = []
    const missed = new Set<string>()
    for (const s of queued) {
      if (plan.length >= limit) break
      const budget = { memMib: s.memMib, vcpus: s.vcpus }
      // Room only shrinks during a walk: a budget that fit nowhere (for any affinity) fits nowhere later.
      const key = `${s.memMib}/${s.vcpus}`
      if (missed.has(key)) continue
      const hostId = index.pick({ budget, affinity: s.affinity })
      if (hostId === null) {
        missed.add(key)
        continue
      }
      const c = byHost.get(hostId) as FleetHost
      const next = placedOn(c, budget)
      byHost.set(hostId, next)
      index.upsert(next)
      plan.push({ sessionId: s.id, hostId, budget })
    }
    return plan
  }

  /** The candidate with one more reservation of `budget` (summing reservations, nothing more). */
  const placedOn = (c: FleetHost, budget: Budget): FleetHost => ({
    ...c,
    headroom: {
      ...c.headroom,
      reserved: { memMib: c.headroom.reserved.memMib + budget.memMib, vcpus: c.headroom.reserved.vcpus + budget.vcpus },
    },
    entries: (c.entries ?? 0) + 1,
  })

  const countQueued = async (tx: Exec): Promise<number> =>
    Number((await query<{ n: number }>(tx, sql`select count(*)::int as n from sessions where state = 'queued'`))[0]?.n ?? 0)

  const drainQueue: StoreShape["drainQueue"] = (options = {}) =>
    Effect.gen(function* () {
      const t = yield* now
      const limit = options.limit ?? Number.POSITIVE_INFINITY
      return yield* op<DrainResult, never>(async (tx, attempt) => {
        if (!(limit > 0)) return ok({ placed: [], remaining: await countQueued(tx) })
        // The queued rows this drain decides on, locked; a concurrent drain takes the others.
        const [queued, rows] = await both(
          () =>
            tx
              .select()
              .from(sessions)
              .where(eq(sessions.state, "queued"))
              .orderBy(asc(sessions.queuedAt), asc(sessions.id))
              .for("update", { skipLocked: true }),
          () => readRoom(tx, { columns: "room" }),
        )
        if (queued.length === 0) return ok({ placed: [], remaining: await countQueued(tx) })
        const plan = planDrain(queued, candidatesOf(rows), limit)
        if (plan.length === 0) return ok({ placed: [], remaining: await countQueued(tx) })
        // Lock every host of the plan in id order, then replay the plan against fresh sums.
        const hostIds = [...new Set(plan.map((p) => p.hostId))].sort()
        await lockHosts(tx, hostIds)
        const fresh = new Map((await readRoom(tx, { hostIds, columns: "room" })).map((r) => [r.id, toCandidate(r, limits)]))
        const accepted: Planned[] = []
        let diverged = false
        for (const p of plan) {
          const c = fresh.get(p.hostId)
          if (c !== undefined && Placement.fitsOn(c, p.budget, limits)) {
            fresh.set(p.hostId, placedOn(c, p.budget))
            accepted.push(p)
          } else diverged = true
        }
        // Room changed between the read and the locks: plan again from fresh figures.
        if (diverged && attempt < 2) return retry
        const rowsJson = JSON.stringify(
          accepted.map((p) => ({ sid: p.sessionId, hid: p.hostId, rid: randomUUID(), mem: p.budget.memMib, vcpus: p.budget.vcpus })),
        )
        if (accepted.length > 0)
          await tx.execute(sql`with p as (
              select * from jsonb_to_recordset(${rowsJson}::jsonb) as p(sid text, hid text, rid text, mem float8, vcpus float8)
            ), s as (
              update sessions set state = 'pending', host_id = p.hid, reservation_id = p.rid, queued_at = null, updated_at = ${t}
              from p where sessions.id = p.sid and sessions.state = 'queued'
              returning sessions.id
            ), r as (
              insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, created_at, last_heartbeat_at)
              select p.rid, p.hid, 'session', p.sid, p.mem, p.vcpus, ${t}, ${t} from p join s on s.id = p.sid
              returning host_id, mem_mib, vcpus
            ), h as (${hostSumsSql("+", sql`r`)}), m as (${bumpMetricSql("total_reserved_mib", sql`sum(mem_mib)`, sql`r`)})
            select count(*) from s`)
        return ok({
          placed: accepted.map((p) => ({ sessionId: p.sessionId, hostId: p.hostId })),
          remaining: await countQueued(tx),
        })
      })
    })

  // ---- the ledger ------------------------------------------------------------------------------

  const reserve: StoreShape["reserve"] = (input: ReserveInput) =>
    Effect.gen(function* () {
      const bad = Validate.ownerKind(input.ownerKind) ?? Validate.reserveExtras(input)
      if (bad) return yield* bad
      const t = yield* now
      return yield* op<Reservation, Refused | Conflict>(
        async (tx) => {
          let duplicate = false
          let host: Ledger.HostView | undefined
          const id = input.id
          const hostId = input.hostId
          if (typeof hostId === "string" && hostId !== "") {
            await lockHosts(tx, [hostId])
            const [dup, rows] = await both(
              () =>
                typeof id === "string" && id !== ""
                  ? tx.select({ id: reservations.id }).from(reservations).where(eq(reservations.id, id))
                  : Promise.resolve([]),
              () => readRoom(tx, { hostIds: [hostId] }),
            )
            duplicate = dup.length > 0
            const row = rows[0]
            if (row !== undefined) {
              const c = toCandidate(row, limits)
              host = { measured: c.measured ?? false, headroom: c.headroom, entries: row.entries }
            }
          } else if (typeof id === "string" && id !== "") {
            duplicate = (await tx.select({ id: reservations.id }).from(reservations).where(eq(reservations.id, id))).length > 0
          }
          const admission = Ledger.admit(input, { duplicate, host }, limits)
          if (admission._tag === "Refuse") {
            if (admission.check === "duplicate")
              return err(new Conflict({ entity: "reservation", id: String(id), reason: admission.message }))
            await countReserveFailure(tx)
            return err(new Refused({ check: admission.check, reason: admission.message }))
          }
          const entry: LedgerEntry = {
            id: id as string,
            hostId: hostId as string,
            ownerKind: input.ownerKind,
            ownerId: input.ownerId,
            memMib: input.memMib,
            vcpus: input.vcpus,
            vramMib: input.vramMib ?? null,
            createdAt: t,
            lastHeartbeatAt: t,
            expiresAt: input.expiresAt ?? null,
            description: input.description ?? null,
          }
          await insertEntry(tx, { ...entry, now: t })
          return ok(entry)
        },
        () => new Conflict({ entity: "reservation", id: String(input.id), reason: `reservation ${String(input.id)} already exists` }),
      )
    })

  const release: StoreShape["release"] = (id) =>
    op<Reservation, NotFound | Refused>(async (tx) => {
      const [e] = await tx.select().from(reservations).where(eq(reservations.id, id)).for("update")
      if (e === undefined) return err(new NotFound({ entity: "reservation", id }))
      if (e.ownerKind === "session" || e.ownerKind === "move")
        return err(
          new Refused({
            check: "owned",
            reason: `reservation ${id} is held by ${e.ownerKind} ${e.ownerId}: end the session or abort the move`,
          }),
        )
      await removeEntries(tx, [id], "released")
      return ok(toReservation(e))
    })

  const reclaim: StoreShape["reclaim"] = () =>
    Effect.gen(function* () {
      const t = yield* now
      return yield* op<ReclaimResult, never>(async (tx) => {
        // Liveness is core's rule: read the figures it needs, let it judge, then lock and judge again.
        const all = await tx
          .select({ id: reservations.id, expiresAt: reservations.expiresAt, lastHeartbeatAt: reservations.lastHeartbeatAt })
          .from(reservations)
        const suspects = Ledger.reclaimable(all, t, limits).map((e) => e.id)
        if (suspects.length === 0) return ok({ reclaimed: [], lostSessions: [] })
        const lockedRows = await tx
          .select()
          .from(reservations)
          .where(inJson(reservations.id, suspects))
          .orderBy(reservations.id)
          .for("update")
        const doomed = Ledger.reclaimable(lockedRows.map(toReservation), t, limits)
        const sessionIds = doomed.filter((e) => e.ownerKind === "session").map((e) => e.ownerId)
        const moveIds = doomed.filter((e) => e.ownerKind === "move").map((e) => e.ownerId)
        const [sessionRows, moveRows] = await both(
          () =>
            sessionIds.length === 0
              ? Promise.resolve([] as SessionRow[])
              : tx.select().from(sessions).where(inJson(sessions.id, sessionIds)).orderBy(sessions.id).for("update"),
          () =>
            sessionIds.length + moveIds.length === 0
              ? Promise.resolve([] as MoveRow[])
              : tx
                  .select()
                  .from(moves)
                  .where(
                    and(
                      eq(moves.state, "pending"),
                      sql`(${moves.id} in ${jsonList(moveIds)} or ${moves.sessionId} in ${jsonList(sessionIds)})`,
                    ),
                  )
                  .orderBy(moves.id)
                  .for("update"),
        )
        const sessionById = new Map(sessionRows.map((s) => [s.id, s]))
        const openMoveOf = new Map(moveRows.map((m) => [m.sessionId, m]))
        const moveById = new Map(moveRows.map((m) => [m.id, m]))
        const doomedIds = new Set(doomed.map((e) => e.id))
        const removed = new Set<string>()
        const toRemove: string[] = []
        const toRelease: string[] = []
        const lost: string[] = []
        const backToRunning: string[] = []
        const closed: { readonly move: MoveRow; readonly reason: string }[] = []
        const closedIds = new Set<string>()
        for (const e of doomed) {
          if (removed.has(e.id)) continue
          if (e.ownerKind === "session") {
            const s = sessionById.get(e.ownerId)
            if (s !== undefined && s.reservationId === e.id) {
              const m = openMoveOf.get(s.id)
              if (m !== undefined && !closedIds.has(m.id)) {
                // The move aborts: its target entry is released (reclaimed only if stale itself).
                closedIds.add(m.id)
                closed.push({ move: m, reason: "session lost: its reservation was reclaimed" })
                if (!doomedIds.has(m.reservationId)) {
                  removed.add(m.reservationId)
                  toRelease.push(m.reservationId)
                }
              }
              removed.add(e.id)
              toRemove.push(e.id)
              if (illegal(s, "lost") === null) lost.push(s.id)
              continue
            }
          }
          if (e.ownerKind === "move") {
            const m = moveById.get(e.ownerId)
            if (m !== undefined && !closedIds.has(m.id)) {
              closedIds.add(m.id)
              closed.push({ move: m, reason: "move target's reservation was reclaimed" })
              const s = sessionById.get(m.sessionId) ?? (await lockSession(tx, m.sessionId))
              if (s !== undefined && s.state === "moving" && !lost.includes(s.id) && illegal(s, "running") === null)
                backToRunning.push(s.id)
            }
          }
          removed.add(e.id)
          toRemove.push(e.id)
        }
        const reclaimed = await removeEntries(tx, toRemove, "reclaimed")
        await removeEntries(tx, toRelease, "released")
        for (const c of closed)
          await tx
            .update(moves)
            .set({ state: "aborted", abortReason: c.reason, endedAt: t })
            .where(eq(moves.id, c.move.id))
        if (lost.length > 0)
          await tx
            .update(sessions)
            .set({ state: "lost", hostId: null, reservationId: null, parkedAt: null, updatedAt: t })
            .where(inJson(sessions.id, lost))
        // A session whose own entry went too is lost, whichever of its entries came first.
        const running = backToRunning.filter((id) => !lost.includes(id))
        if (running.length > 0)
          await tx.update(sessions).set({ state: "running", updatedAt: t }).where(inJson(sessions.id, running))
        return ok({ reclaimed: reclaimed.sort(byId), lostSessions: [...lost].sort() })
      })
    })

  const summaryOf = (row: RoomRow, entries: readonly LedgerEntry[], t: number): Ledger.HostSummary =>
    Ledger.summarizeHost(row.id, toCandidate(row, limits).headroom.allocatableMib, entries, t, limits)

  // ---- moves -----------------------------------------------------------------------------------

  const beginMove: StoreShape["beginMove"] = (input) =>
    Effect.gen(function* () {
      const t = yield* now
      return yield* op<Move, NotFound | Conflict | IllegalTransition | Refused | InvalidInput>(
        async (tx) => {
          const s = await lockSession(tx, input.sessionId)
          if (s === undefined) return err(sessionNotFound(input.sessionId))
          const open = await lockOpenMove(tx, s.id)
          if (open !== undefined)
            return err(new Conflict({ entity: "move", id: open.id, reason: `session ${s.id} already has an open move` }))
          const bad = refusedOp(s, "beginMove", "moving")
          if (bad) return err(bad)
          if (s.state !== "running")
            return err(
              new IllegalTransition({
                sessionId: s.id,
                from: s.state,
                to: "moving",
                reason: `only a running session can move, not a ${s.state} one`,
              }),
            )
          const badDowntime = Validate.maxDowntimeMs(input.maxDowntimeMs)
          if (badDowntime) return err(badDowntime)
          const source = s.hostId as string
          const budget: Budget = { memMib: s.memMib, vcpus: s.vcpus }
          let targetId: string
          if (input.targetHostId !== undefined) {
            if (input.targetHostId === source)
              return err(new InvalidInput({ field: "targetHostId", rule: "must differ from the source host" }))
            const locked = await lockHosts(tx, [input.targetHostId])
            if (locked.length === 0) return err(hostNotFound(input.targetHostId))
            const row = (await readRoom(tx, { hostIds: [input.targetHostId] }))[0] as RoomRow
            const c = toCandidate(row, limits)
            if (!Placement.fitsOn(c, budget, limits))
              return err(
                new Refused({
                  check: "no_fit",
                  reason: `host ${c.id} cannot take the session: ${Placement.reasonFor(c, budget, limits)}`,
                }),
              )
            targetId = c.id
          } else {
            const picked = await pickAndLock(tx, { budget, affinity: s.affinity }, limits, { excludeHostId: source })
            if (picked._tag === "NoFit")
              return err(new Refused({ check: "no_fit", reason: `no host other than ${source} can take the session` }))
            targetId = picked.hostId
          }
          const moveId = randomUUID()
          const reservationId = randomUUID()
          await insertEntry(tx, {
            id: reservationId,
            hostId: targetId,
            ownerKind: "move",
            ownerId: moveId,
            memMib: budget.memMib,
            vcpus: budget.vcpus,
            now: t,
          })
          const [m] = await tx
            .insert(moves)
            .values({
              id: moveId,
              sessionId: s.id,
              sourceHostId: source,
              targetHostId: targetId,
              reservationId,
              maxDowntimeMs: input.maxDowntimeMs,
              state: "pending",
              rounds: [],
              phases: null,
              abortReason: null,
              abortEstimateMs: null,
              createdAt: t,
              endedAt: null,
            })
            .returning()
          await updateSession(tx, s.id, { state: "moving", parkedAt: null, updatedAt: t })
          return ok(toMove(m as MoveRow))
        },
        () => new Conflict({ entity: "move", id: input.sessionId, reason: `session ${input.sessionId} already has an open move` }),
      )
    })

  const pendingMove = (m: MoveRow): Conflict | null =>
    m.state === "pending" ? null : new Conflict({ entity: "move", id: m.id, reason: `move is ${m.state}` })

  // ---- the store -------------------------------------------------------------------------------

  const store: StoreShape = {
    limits: () => limits,

    registerHost: (input) =>
      Effect.gen(function* () {
        const bad = Validate.hostInput(input)
        if (bad) return yield* bad
        const t = yield* now
        const labels = { ...(input.labels ?? {}) }
        forgetRoom()
        const inserted = yield* read((exec) =>
          exec
            .insert(hosts)
            .values({ id: input.id, labels, state: "ready", tokenHash: input.tokenHash ?? null, createdAt: t })
            .onConflictDoNothing()
            .returning({ id: hosts.id }),
        )
        forgetRoom()
        if (inserted.length === 0) return yield* new Conflict({ entity: "host", id: input.id, reason: "host already registered" })
        const host: Host = { id: input.id, labels, state: "ready", report: null, reportedAt: null, createdAt: t }
        return host
      }),

    reportHost: (id, report) =>
      Effect.gen(function* () {
        const t = yield* now
        return yield* op<HostView, NotFound | InvalidInput>(async (tx) => {
          const [h] = await tx.select({ id: hosts.id }).from(hosts).where(eq(hosts.id, id)).for("no key update")
          if (h === undefined) return err(hostNotFound(id))
          const bad = Validate.report(report)
          if (bad) return err(bad)
          await tx
            .update(hosts)
            .set({
              totalMib: report.totalMib,
              allocatableMib: report.allocatableMib,
              totalVcpus: report.totalVcpus,
              reportedAt: t,
              version: sql`${hosts.version} + 1`,
            })
            .where(eq(hosts.id, id))
          return ok((await hostView(tx, id)) as HostView)
        })
      }),

    setHostState: (id, state) =>
      op<HostView, NotFound>(async (tx) => {
        const updated = await tx.update(hosts).set({ state, version: sql`${hosts.version} + 1` }).where(eq(hosts.id, id)).returning({ id: hosts.id })
        if (updated.length === 0) return err(hostNotFound(id))
        return ok((await hostView(tx, id)) as HostView)
      }),

    getHost: (id) =>
      Effect.flatMap(read((exec) => hostView(exec, id)), (v) => (v === undefined ? Effect.fail(hostNotFound(id)) : Effect.succeed(v))),

    hostTokenHash: (id) =>
      Effect.flatMap(
        read((exec) => exec.select({ tokenHash: hosts.tokenHash }).from(hosts).where(eq(hosts.id, id))),
        (rows) => (rows[0] === undefined ? Effect.fail(hostNotFound(id)) : Effect.succeed(rows[0].tokenHash)),
      ),

    hostByTokenHash: (tokenHash) =>
      Effect.map(
        read((exec) => exec.select().from(hosts).where(eq(hosts.tokenHash, tokenHash)).orderBy(hosts.id).limit(1)),
        (rows): Host | null => {
          const h = rows[0]
          if (h === undefined) return null
          return {
            id: h.id,
            labels: { ...h.labels },
            state: h.state,
            report: h.reportedAt === null ? null : { totalMib: h.totalMib, allocatableMib: h.allocatableMib, totalVcpus: h.totalVcpus },
            reportedAt: h.reportedAt,
            createdAt: h.createdAt,
          }
        },
      ),

    listHosts: () =>
      Effect.map(
        read((exec) => readRoom(exec, { sessions: "counts" })),
        (rows) => rows.map((r) => toHostView(r, limits)),
      ),

    fleetView: () =>
      Effect.gen(function* () {
        const readAt = yield* now
        // One statement: one snapshot of hosts, sums, parks and the queue, in one round trip.
        const [row] = yield* read((exec) =>
          query<{ hosts: unknown; queue: unknown }>(
            exec,
            sql`select
              (select coalesce(json_agg(x order by x.id), '[]'::json) from (${roomSql({ sessions: "parks" })}) x) as hosts,
              (select coalesce(json_agg(json_build_object('sessionId', id, 'memMib', mem_mib, 'vcpus', vcpus, 'queuedAt', queued_at)
                 order by queued_at, id), '[]'::json)
               from sessions where state = 'queued') as queue`,
          ),
        )
        const parse = (v: unknown): unknown => (typeof v === "string" ? JSON.parse(v) : v)
        const hostRows = (parse(row?.hosts) ?? []) as Record<string, unknown>[]
        const queueRows = (parse(row?.queue) ?? []) as { sessionId: string; memMib: number; vcpus: number; queuedAt: number }[]
        const fleetHosts = hostRows.map((r) => toCandidate(toRoomRow(r), limits))
        const queue: Queued[] = queueRows.map((q) => ({
          sessionId: q.sessionId,
          budget: { memMib: Number(q.memMib), vcpus: Number(q.vcpus) },
          queuedAt: Number(q.queuedAt),
        }))
        const fleet: FleetRead = { hosts: fleetHosts, queue, readAt }
        return fleet
      }),

    createSession,

    getSession: (id) =>
      Effect.flatMap(
        read((exec) => exec.select().from(sessions).where(eq(sessions.id, id))),
        (rows) => (rows[0] === undefined ? Effect.fail(sessionNotFound(id)) : Effect.succeed(toSession(rows[0]))),
      ),

    listSessions: (filter: SessionFilter = {}) =>
      Effect.map(
        read((exec) =>
          exec
            .select()
            .from(sessions)
            .where(
              and(
                filter.state === undefined ? undefined : eq(sessions.state, filter.state),
                filter.hostId === undefined ? undefined : eq(sessions.hostId, filter.hostId),
              ),
            )
            .orderBy(asc(sessions.createdAt), asc(sessions.id)),
        ),
        (rows) => rows.map(toSession),
      ),

    markRunning: (id) => transitionOnly(id, "markRunning", "running"),
    idle: (id, mayPark) => transitionOnly(id, "idle", mayPark ? "parked" : "descending"),
    unpark: (id) => transitionOnly(id, "unpark", "running"),
    beginDescent: (id) => transitionOnly(id, "beginDescent", "descending"),

    finishDescent: (id) =>
      Effect.gen(function* () {
        const t = yield* now
        return yield* op<Session, NotFound | IllegalTransition>(async (tx) => {
          const s = await lockSession(tx, id)
          if (s === undefined) return err(sessionNotFound(id))
          const bad = refusedOp(s, "finishDescent", "descended")
          if (bad) return err(bad)
          if (s.reservationId !== null) await removeEntries(tx, [s.reservationId], "released")
          return ok(
            await updateSession(tx, id, { state: "descended", hostId: null, reservationId: null, parkedAt: null, updatedAt: t }),
          )
        })
      }),

    resume,

    endSession: (id) =>
      Effect.gen(function* () {
        const t = yield* now
        return yield* op<Session, NotFound | IllegalTransition>(async (tx) => {
          const s = await lockSession(tx, id)
          if (s === undefined) return err(sessionNotFound(id))
          const bad = refusedOp(s, "end", "ended")
          if (bad) return err(bad)
          const open = await lockOpenMove(tx, id)
          if (open !== undefined) await closeMove(tx, open, "session ended", t, "released")
          if (s.reservationId !== null) await removeEntries(tx, [s.reservationId], "released")
          return ok(
            await updateSession(tx, id, {
              state: "ended",
              hostId: null,
              reservationId: null,
              queuedAt: null,
              parkedAt: null,
              updatedAt: t,
            }),
          )
        })
      }),

    listQueue: () =>
      Effect.map(
        read((exec) =>
          exec
            .select()
            .from(sessions)
            .where(eq(sessions.state, "queued"))
            .orderBy(asc(sessions.queuedAt), asc(sessions.id)),
        ),
        (rows) => rows.map(toSession),
      ),

    drainQueue,

    reserve,
    release,

    heartbeat: (id) =>
      Effect.gen(function* () {
        const t = yield* now
        const rows = yield* read((exec) =>
          exec.update(reservations).set({ lastHeartbeatAt: t }).where(eq(reservations.id, id)).returning(),
        )
        const row = rows[0]
        if (row === undefined) return yield* new NotFound({ entity: "reservation", id })
        return toReservation(row)
      }),

    heartbeatHost: (hostId) =>
      Effect.gen(function* () {
        const t = yield* now
        return yield* op<number, NotFound>(async (tx) => {
          const [h] = await tx.select({ id: hosts.id }).from(hosts).where(eq(hosts.id, hostId))
          if (h === undefined) return err(hostNotFound(hostId))
          const renewed = await tx
            .update(reservations)
            .set({ lastHeartbeatAt: t })
            .where(and(eq(reservations.hostId, hostId), inArray(reservations.ownerKind, ["session", "move", "capture"])))
            .returning({ id: reservations.id })
          return ok(renewed.length)
        })
      }),

    getReservation: (id) =>
      Effect.flatMap(
        read((exec) => exec.select().from(reservations).where(eq(reservations.id, id))),
        (rows) =>
          rows[0] === undefined ? Effect.fail(new NotFound({ entity: "reservation", id })) : Effect.succeed(toReservation(rows[0])),
      ),

    listReservations: (filter = {}) =>
      Effect.map(
        read((exec) =>
          exec
            .select()
            .from(reservations)
            .where(filter.hostId === undefined ? undefined : eq(reservations.hostId, filter.hostId))
            .orderBy(asc(reservations.id)),
        ),
        (rows) => rows.map(toReservation),
      ),

    reclaim,

    hostSummary: (hostId) =>
      Effect.gen(function* () {
        const t = yield* now
        return yield* op<Ledger.HostSummary, NotFound>(async (tx) => {
          const [rows, entries] = await both(
            () => readRoom(tx, { hostIds: [hostId] }),
            () => tx.select().from(reservations).where(eq(reservations.hostId, hostId)),
          )
          const row = rows[0]
          if (row === undefined) return err(hostNotFound(hostId))
          return ok(summaryOf(row, entries.map(toReservation), t))
        })
      }),

    clusterSummary: () =>
      Effect.gen(function* () {
        const t = yield* now
        return yield* op<Ledger.ClusterSummary, never>(async (tx) => {
          const [rows, entries] = await both(
            () => readRoom(tx),
            () => tx.select().from(reservations),
          )
          const byHost = new Map<string, LedgerEntry[]>()
          for (const e of entries) {
            const list = byHost.get(e.hostId)
            if (list === undefined) byHost.set(e.hostId, [toReservation(e)])
            else list.push(toReservation(e))
          }
          return ok(Ledger.summarizeCluster(rows.map((r) => summaryOf(r, byHost.get(r.id) ?? [], t))))
        })
      }),

    metrics: () =>
      Effect.map(
        read((exec) =>
          query<Record<string, unknown>>(
            exec,
            sql`select
              coalesce((select sum(total_reserved_mib) from metrics), 0)::float8 as "totalReservedMib",
              coalesce((select sum(total_released_mib) from metrics), 0)::float8 as "totalReleasedMib",
              coalesce((select sum(total_reclaimed_mib) from metrics), 0)::float8 as "totalReclaimedMib",
              coalesce((select sum(reserve_failures) from metrics), 0)::float8 as "reserveFailures",
              (select count(*) from reservations)::float8 as "activeEntries"`,
          ),
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
      ),

    beginMove,

    recordRound: (moveId, round) =>
      op<Move, NotFound | Conflict | InvalidInput>(async (tx) => {
        const m = await lockMove(tx, moveId)
        if (m === undefined) return err(moveNotFound(moveId))
        const notPending = pendingMove(m)
        if (notPending) return err(notPending)
        const bad = Validate.round(round)
        if (bad) return err(bad)
        const entry = {
          kind: round.kind,
          wireBytes: round.wireBytes,
          apparentBytes: round.apparentBytes,
          sendMs: round.sendMs,
          captureMs: round.captureMs,
        }
        const [row] = await tx
          .update(moves)
          .set({ rounds: sql`${moves.rounds} || jsonb_build_array(${JSON.stringify(entry)}::jsonb)` })
          .where(eq(moves.id, moveId))
          .returning()
        return ok(toMove(row as MoveRow))
      }),

    commitMove: (moveId, phases) =>
      Effect.gen(function* () {
        const bad = Validate.phases(phases)
        if (bad) return yield* bad
        const t = yield* now
        return yield* op<Move, NotFound | Conflict>(async (tx) => {
          const m = await lockMove(tx, moveId)
          if (m === undefined) return err(moveNotFound(moveId))
          const notPending = pendingMove(m)
          if (notPending) return err(notPending)
          const s = (await lockSession(tx, m.sessionId)) as SessionRow
          // The target's reservation becomes the session's; the source's is released.
          await tx
            .update(reservations)
            .set({ ownerKind: "session", ownerId: s.id, lastHeartbeatAt: t })
            .where(eq(reservations.id, m.reservationId))
          if (s.reservationId !== null && s.reservationId !== m.reservationId)
            await removeEntries(tx, [s.reservationId], "released")
          await updateSession(tx, s.id, {
            state: "running",
            hostId: m.targetHostId,
            reservationId: m.reservationId,
            parkedAt: null,
            updatedAt: t,
          })
          const [row] = await tx
            .update(moves)
            .set({
              state: "committed",
              phases: { downtimeMs: phases.downtimeMs, captureMs: phases.captureMs, sendMs: phases.sendMs, commitMs: phases.commitMs },
              endedAt: t,
            })
            .where(eq(moves.id, moveId))
            .returning()
          return ok(toMove(row as MoveRow))
        })
      }),

    abortMove: (moveId, reason, options = {}) =>
      Effect.gen(function* () {
        const bad = Validate.text("reason", reason) ?? Validate.estimateMs(options.estimateMs)
        if (bad) return yield* bad
        const t = yield* now
        return yield* op<Move, NotFound | Conflict>(async (tx) => {
          // Decided under the move's row lock: a final round recorded concurrently either
          // committed before this lock (we see it and refuse) or waits for this transaction.
          const m = await lockMove(tx, moveId)
          if (m === undefined) return err(moveNotFound(moveId))
          const notPending = pendingMove(m)
          if (notPending) return err(notPending)
          if (options.onlyBeforeFinalRound === true && (m.rounds as MoveRound[]).some((r) => r.kind === "final"))
            return err(new Conflict({ entity: "move", id: m.id, reason: "final round recorded: the pause is spent" }))
          await closeMove(tx, m, reason, t, "released", options.estimateMs ?? null)
          const s = await lockSession(tx, m.sessionId)
          if (s !== undefined && s.state === "moving" && illegal(s, "running") === null)
            await updateSession(tx, s.id, { state: "running", updatedAt: t })
          const [row] = await tx.select().from(moves).where(eq(moves.id, moveId))
          return ok(toMove(row as MoveRow))
        })
      }),

    getMove: (id) =>
      Effect.flatMap(
        read((exec) => exec.select().from(moves).where(eq(moves.id, id))),
        (rows) => (rows[0] === undefined ? Effect.fail(moveNotFound(id)) : Effect.succeed(toMove(rows[0]))),
      ),

    listMoves: (filter = {}) =>
      Effect.map(
        read((exec) =>
          exec
            .select()
            .from(moves)
            .where(
              and(
                filter.state === undefined ? undefined : eq(moves.state, filter.state),
                filter.hostId === undefined
                  ? undefined
                  : or(eq(moves.sourceHostId, filter.hostId), eq(moves.targetHostId, filter.hostId)),
              ),
            )
            .orderBy(asc(moves.createdAt), asc(moves.id)),
        ),
        (rows) => rows.map(toMove),
      ),

    openMove: (sessionId) =>
      Effect.map(
        read((exec) =>
          exec
            .select()
            .from(moves)
            .where(and(eq(moves.sessionId, sessionId), eq(moves.state, "pending"))),
        ),
        (rows) => (rows[0] === undefined ? null : toMove(rows[0])),
      ),
  }

  const testing: StoreTestingShape = {
    reset: (next) =>
      read((exec) => exec.execute(sql`truncate table moves, reservations, sessions, hosts, metrics`)).pipe(
        Effect.andThen(
          Effect.sync(() => {
            forgetRoom()
            limits = next ?? Limits.defaults
            forgetKnown()
          }),
        ),
      ),
  }

  return { store, testing, sumsDrift: read(readSumsDrift) }
}

// ---- opening a database --------------------------------------------------------------------------

const unavailable = (cause: unknown): Unavailable =>
  new Unavailable({ reason: cause instanceof Error ? cause.message : String(cause), retryAfterMs })

/**
 * drizzle runs every statement through postgres.js `unsafe(…, { prepare: false })`: a
 * statement with parameters then costs two round trips (describe, then execute) and stalls
 * the connection's pipeline. Our
 * statement texts are a fixed set (id lists travel as one jsonb parameter), so we prepare
 * them all, on the pool and inside every transaction: one round trip per statement.
 */
const preparing = (client: postgres.Sql): postgres.Sql => {
  const unsafe = client.unsafe.bind(client)
  const patched = client as unknown as {
    unsafe: (query: string, args?: unknown[], options?: Record<string, unknown>) => unknown
    begin: (...args: unknown[]) => unknown
  }
  patched.unsafe = (query, args = [], options = {}) =>
    (unsafe as (q: string, a: unknown[], o: Record<string, unknown>) => unknown)(query, args, { ...options, prepare: true })
  if (typeof patched.begin === "function") {
    const begin = patched.begin.bind(client)
    patched.begin = (...args: unknown[]) => {
      const body = args[args.length - 1] as (tx: postgres.Sql) => unknown
      return begin(...args.slice(0, -1), (tx: postgres.Sql) => body(preparing(tx)))
    }
  }
  return client
}

/** Opens the store on a PostgreSQL URL: applies the migrations, then a postgres.js pool. Closed with the scope. */
export const openUrl = (options: PgOptions) =>
  Effect.gen(function* () {
    if (options.migrate !== false) yield* Effect.tryPromise({ try: () => migrateUrl(options.url), catch: unavailable })
    const client = yield* Effect.acquireRelease(
      Effect.sync(() =>
        preparing(
          postgres(options.url, {
            max: options.poolSize ?? 10,
            connect_timeout: options.connectTimeoutSec ?? 5,
            onnotice: () => undefined,
          }),
        ),
      ),
      (c) => Effect.promise(() => c.end({ timeout: 5 })),
    )
    const db = makePostgresDb(client, drizzlePostgres({ client }) as unknown as Exec, preparing)
    return make(db, options.limits ?? Limits.defaults, {
      placementReadMaxAgeMs: options.placementReadMaxAgeMs,
      optimisticPlacementAttempts: options.optimisticPlacementAttempts,
    })
  })

/** Opens the store on PGlite (in memory, or in `dataDir`): applies the migrations. Closed with the scope. */
export const openPglite = (options: PgliteOptions = {}) =>
  Effect.gen(function* () {
    const client = yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: async () => {
          const c = options.dataDir === undefined ? new PGlite() : new PGlite(options.dataDir)
          await c.waitReady
          return c
        },
        catch: unavailable,
      }),
      (c) => Effect.promise(() => (c.closed ? Promise.resolve() : c.close())),
    )
    yield* Effect.tryPromise({ try: () => migratePgliteClient(client), catch: unavailable })
    // One connection: every operation runs alone, in turn.
    const db = makeDb("pglite", drizzlePglite({ client }) as unknown as Exec, true)
    return make(db, options.limits ?? Limits.defaults, {
      placementReadMaxAgeMs: options.placementReadMaxAgeMs,
      optimisticPlacementAttempts: options.optimisticPlacementAttempts,
    })
  })

const testingContext = (pair: StorePair): Context.Context<Store | StoreTesting> =>
  Context.add(Context.make(Store, pair.store), StoreTesting, pair.testing)

/** The store on a PostgreSQL URL. */
export const layer = (options: PgOptions): Layer.Layer<Store, Unavailable> =>
  Layer.effect(Store, Effect.map(openUrl(options), (p) => p.store))

/** The store on PGlite (embedded; in memory unless `dataDir`). */
export const layerPglite = (options: PgliteOptions = {}): Layer.Layer<Store, Unavailable> =>
  Layer.effect(Store, Effect.map(openPglite(options), (p) => p.store))

/** The store on a PostgreSQL URL with its `StoreTesting` reset (for the conformance suite). */
export const layerTesting = (options: PgOptions): Layer.Layer<Store | StoreTesting, Unavailable> =>
  Layer.effectContext(Effect.map(openUrl(options), testingContext))

/** The store on PGlite with its `StoreTesting` reset (for the conformance suite). */
export const layerPgliteTesting = (options: PgliteOptions = {}): Layer.Layer<Store | StoreTesting, Unavailable> =>
  Layer.effectContext(Effect.map(openPglite(options), testingContext))
