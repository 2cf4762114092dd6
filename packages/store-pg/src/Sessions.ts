/**
 * Sessions: creates (placed or queued), reads, and every state change of a session by
 * itself (SPEC §2). Each change reads the session under its row lock, asks core's
 * `Session.step`, and writes the answer in the same transaction. New sessions are placed
 * optimistically and in groups: concurrent creates are gathered (`Batcher.ts`), core walks
 * the batch in order over the cached rows (`QueueWalk`), and one statement writes every
 * placement only if its host is still at the version core decided on; after repeated lost
 * races a create takes the locking path.
 */
import { randomUUID } from "node:crypto"
import { Placement, QueueWalk, Session as SessionRules } from "@engram/core"
import type { Budget, FleetHost, Limits } from "@engram/core"
import { Cursor, fromRefusal, NoRoom, NotFound, Unavailable, Validate } from "@engram/store"
import type { Conflict, IllegalTransition, OnNoRoom, PlaceOutcome, QueueStanding, Session, SessionFilter, StepRefusal, StoreShape } from "@engram/store"
import { and, asc, eq, gt, inArray, sql } from "drizzle-orm"
import type { SQL } from "drizzle-orm"
import { Effect } from "effect"
import * as Batcher from "./Batcher.js"
import { query, retryAfterMs } from "./Db.js"
import type { DbError, Exec } from "./Db.js"
import type { Deps } from "./Deps.js"
import { lockHosts, lockOpenMove, lockSession, pickAndLock } from "./Locks.js"
import * as Pages from "./Pages.js"
import { readRoom, roomColumns, toCandidate, toRoomRow } from "./Room.js"
import type { RoomRow } from "./Room.js"
import { toMove, toSession, toSessionEvent } from "./Rows.js"
import { sessionEvents, sessions } from "./schema.js"
import { err, ok, retry } from "./Transaction.js"
import { applyStep, bumpMetricSql, hostSumsSql } from "./Writes.js"

type SessionOps = Pick<
  StoreShape,
  | "createSession"
  | "getSession"
  | "listSessions"
  | "pageSessions"
  | "sessionEvents"
  | "queueStanding"
  | "markRunning"
  | "idle"
  | "unpark"
  | "beginDescent"
  | "finishDescent"
  | "resume"
  | "endSession"
>

/** Options of the placement of new sessions. */
export interface PlacementOptions {
  /** See `StorePg.StoreOptions.placementReadMaxAgeMs`. */
  readonly maxReadAgeMs: number
  /** See `StorePg.StoreOptions.optimisticPlacementAttempts`. */
  readonly maxCasAttempts: number
  /** See `StorePg.StoreOptions.placementBatchSize`. */
  readonly batchSize: number
  /** See `StorePg.StoreOptions.placementBatchWindowMs`. */
  readonly batchWindowMs: number
}

const sessionNotFound = (id: string) => new NotFound({ entity: "session", id })

/** The SQL of a session filter: its state and its host. */
const filterOf = (filter: SessionFilter) =>
  and(
    filter.state === undefined ? undefined : eq(sessions.state, filter.state),
    filter.hostId === undefined ? undefined : eq(sessions.hostId, filter.hostId),
  )

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

/** Where a queued session stands among `hosts` (core's no-fit details and `too_big`), at `position`. */
export const standingOf = (s: Session, hosts: readonly FleetHost[], position: number, limits: Limits.Limits): QueueStanding => ({
  position,
  noFit: Placement.noFit(hosts, { budget: s.budget, affinity: s.affinity }, limits),
  tooBig: Placement.tooBigFor(hosts, limits)(s.budget),
})

/** The history of a new session (inserted by the CTE `s`, one row): its events numbered from 1. */
const newEventsSql = (from: SQL, events: readonly SessionRules.Event[], at: number): SQL => sql`insert into session_events (session_id, seq, at, event)
    select s.id, x.n, ${at}, x.e from ${from} s
    cross join jsonb_array_elements(${JSON.stringify(events)}::jsonb) with ordinality as x(e, n)`

const insertSessionSql = (s: Session): SQL => sql`insert into sessions
      (id, state, mem_mib, vcpus, affinity, host_id, reservation_id, queued_at, parked_at, created_at, updated_at)
    values (${s.id}, ${s.state}, ${s.budget.memMib}, ${s.budget.vcpus},
      array(select jsonb_array_elements_text(${JSON.stringify(s.affinity)}::jsonb)),
      ${s.hostId}, ${s.reservationId}, ${s.queuedAt}, ${s.parkedAt}, ${s.createdAt}, ${s.updatedAt})
    on conflict (id) do nothing
    returning id`

/** Inserts a queued session and its history; answers whether it was new and how many queued sessions are ahead of it. */
const insertQueuedSql = (s: Session, events: readonly SessionRules.Event[]): SQL => sql`with s as (${insertSessionSql(s)}),
    ev as (${newEventsSql(sql`s`, events, s.createdAt)})
    select (select count(*)::int from s) as n,
      (select count(*)::int from sessions where state = 'queued'
        and (queued_at < ${s.queuedAt} or (queued_at = ${s.queuedAt} and id < ${s.id}))) as ahead`

/**
 * The placement write: one statement (autocommit: one round trip) for every placement of a
 * batch core decided on one read (`p`, one row each, never two with the same session id;
 * several may go to one host: core's walk took each one's room before judging the next). It
 * adds the placements of each host to that host's sums only if the host row is still at the
 * version core decided on (all of a host's placements apply, or none) and leaves out a session
 * that exists, then inserts the session records and their reservations (as core's steps
 * answered them) of the hosts it updated, and counts the metric. No fit rule here: core
 * judged exactly the row at `v`. A concurrent create of the same id elsewhere makes a session
 * insert a unique violation, which undoes the whole statement.
 */
const placeSql = (batch: unknown): SQL => sql`with p as (
      select * from jsonb_to_recordset(${batch}::jsonb)
        as p(sid text, state text, hid text, v bigint, rid text, mem float8, vcpus float8, aff jsonb, qat bigint, pat bigint,
          cat bigint, uat bigint, rkind text, rat bigint, rbeat bigint, ev jsonb)
    ), e as (
      select sessions.id from sessions join p on sessions.id = p.sid
    ), n as (
      select * from p where not exists (select 1 from e where e.id = p.sid)
    ), g as (
      select hid, v, sum(mem::numeric) as mem, sum(vcpus::numeric) as vcpus, count(*)::int as k from n group by hid, v
    ), h as (
      update hosts set
        reserved_mem_mib = hosts.reserved_mem_mib + g.mem,
        reserved_vcpus = hosts.reserved_vcpus + g.vcpus,
        entries = hosts.entries + g.k,
        version = hosts.version + 1
      from g
      where hosts.id = g.hid and hosts.version = g.v
      returning ${roomColumns("hosts", "room")}
    ), s as (
      insert into sessions (id, state, mem_mib, vcpus, affinity, host_id, reservation_id, queued_at, parked_at, created_at, updated_at)
      select n.sid, n.state, n.mem::bigint, n.vcpus::bigint, array(select jsonb_array_elements_text(n.aff)),
        n.hid, n.rid, n.qat, n.pat, n.cat, n.uat
      from n join h on h.id = n.hid
      returning id
    ), r as (
      insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, created_at, last_heartbeat_at)
      select n.rid, n.hid, n.rkind, s.id, n.mem, n.vcpus, n.rat, n.rbeat from n join s on s.id = n.sid
      returning mem_mib
    ), ev as (
      insert into session_events (session_id, seq, at, event)
      select s.id, x.n, n.cat, x.e from n join s on s.id = n.sid
      cross join lateral jsonb_array_elements(n.ev) with ordinality as x(e, n)
    ), m as (${bumpMetricSql("total_reserved_mib", sql`sum(mem_mib)`, sql`r`)})
    select p.sid as "placeSid", (select count(*)::int from e where e.id = p.sid) as "exists",
      (select count(*)::int from s where s.id = p.sid) as "placed", h.*
    from p left join h on h.id = p.hid`

/** A create core placed: its applied step, and the host row core decided on. */
interface PlaceItem {
  readonly session: Session
  readonly entry: SessionRules.Applied["ledger"][number] & { readonly _tag: "Reserve" }
  readonly events: readonly SessionRules.Event[]
  readonly host: RoomRow
}

type PlaceAnswer = { readonly _tag: "Placed"; readonly row: RoomRow } | { readonly _tag: "Lost" } | { readonly _tag: "Exists" }

/** What a batch of resumes answered one resume: its outcome, or its refusal (nothing changed for it). */
type ResumeAnswer =
  | { readonly _tag: "Done"; readonly outcome: PlaceOutcome }
  | { readonly _tag: "Refused"; readonly error: NotFound | IllegalTransition }

/** A new session waiting in a batch of creates (core's walk sees its budget and affinity). */
interface CreateItem {
  readonly id: string
  readonly budget: Budget
  readonly affinity: readonly string[]
  /** The create's time (the Clock's, when it was called). */
  readonly t: number
  /** Whether it needs a read that starts after it (it found no fit on a reused read, or lost a race). */
  readonly fresh: boolean
}

/** What a batch answered one create. */
type CreateAnswer =
  | { readonly _tag: "Placed"; readonly session: Session }
  | { readonly _tag: "Exists" }
  /** The host core chose changed before the write (another writer): decide again. */
  | { readonly _tag: "Lost" }
  /** Fits nowhere on the read the batch decided on (`fresh`: a read that started after the create). */
  | { readonly _tag: "NoFit"; readonly fresh: boolean }

/** The session operations of the store. */
export const make = ({ db, op, read, both, now, limits, cache }: Deps, options: PlacementOptions): SessionOps => {
  // On postgres.js the placement statement is built once; the batch travels as its one parameter.
  const placeCompiled = db.compile?.(placeSql(sql.placeholder("batch"))) ?? null

  const writePlacements = (items: readonly PlaceItem[]): Effect.Effect<readonly PlaceAnswer[], DbError> => {
    const json = JSON.stringify(
      items.map(({ session: s, entry: { entry: e }, events, host }) => ({
        sid: s.id,
        state: s.state,
        hid: host.id,
        v: host.version,
        rid: e.id,
        mem: e.memMib,
        vcpus: e.vcpus,
        aff: s.affinity,
        qat: s.queuedAt,
        pat: s.parkedAt,
        cat: s.createdAt,
        uat: s.updatedAt,
        rkind: e.ownerKind,
        rat: e.createdAt,
        rbeat: e.lastHeartbeatAt,
        ev: events,
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
      return items.map((i) => out.get(i.session.id) ?? { _tag: "Lost" })
    })
  }

  /**
   * A batch of creates, placed together: one fleet read (a read that starts after every
   * create of the batch, or the reused one within `maxReadAgeMs`), core's walk of the batch
   * in order over it (each placement taking its room before the next is judged), core's step
   * for each placement, and one statement writing them all with the version check.
   */
  const placeBatch = (items: readonly CreateItem[]): Effect.Effect<readonly CreateAnswer[], DbError | Unavailable> =>
    Effect.gen(function* () {
      let fresh = false
      if (!cache.isRecent() || items.some((i) => i.fresh)) {
        yield* cache.readAll(performance.now())
        fresh = true
      }
      const walk = cache.plan(items)
      const answers = new Map<CreateItem, CreateAnswer>()
      for (const i of walk.unplaced) answers.set(i, { _tag: "NoFit", fresh })
      const toWrite = walk.placed.map(({ waiting: i, hostId }): PlaceItem => {
        const answer = created(i.id, i.budget, i.affinity, { hostId, reservationId: randomUUID() }, i.t)
        const host = cache.get(hostId)?.row as RoomRow
        return { session: answer.session, entry: answer.ledger[0] as PlaceItem["entry"], events: answer.events, host }
      })
      if (toWrite.length > 0) {
        const written = yield* writePlacements(toWrite)
        written.forEach((w, k) => {
          const p = toWrite[k] as PlaceItem
          const item = (walk.placed[k] as (typeof walk.placed)[number]).waiting
          if (w._tag === "Placed") {
            cache.learn(w.row)
            answers.set(item, { _tag: "Placed", session: p.session })
          } else answers.set(item, w)
        })
      }
      return items.map((i) => answers.get(i) ?? { _tag: "Lost" })
    })

  // Concurrent creates of this store are gathered (up to `batchSize`, for `batchWindowMs`) and
  // placed by one batch at a time; creates of one session id go in batches one after the other,
  // as sequential creates would. A batch whose statement failed (a unique violation: a session
  // id created concurrently by another store, or anything one create may cause) is undone
  // whole, and its creates run again one by one, so only that one fails.
  const group = Batcher.make<CreateItem, CreateAnswer, DbError | Unavailable>({
    maxBatch: options.batchSize,
    maxInFlight: 1,
    windowMs: options.batchWindowMs,
    keysOf: (i) => [i.id],
    run: (items) =>
      placeBatch(items).pipe(
        Effect.catchTag("UniqueViolation", (u) => (items.length === 1 ? Effect.succeed([{ _tag: "Exists" } as const]) : Effect.fail(u))),
      ),
    splitOn: (e) => e._tag === "UniqueViolation",
  })
  const placeGrouped = (item: CreateItem): Effect.Effect<CreateAnswer, Unavailable> =>
    group(item).pipe(
      Effect.catchTag("UniqueViolation", () => Effect.fail(new Unavailable({ reason: "unexpected unique violation", retryAfterMs }))),
    )

  /** The outcome of a session as it is now (a repeated create, or after a placement). */
  const outcomeOf = async (tx: Exec, s: Session, rows: readonly RoomRow[] | null): Promise<PlaceOutcome> => {
    if (s.hostId !== null) return { _tag: "Placed", session: s }
    const room = rows ?? (await readRoom(tx))
    const position = s.state === "queued" ? await queuePosition(tx, s) : 0
    return { _tag: "Queued", session: s, ...standingOf(s, room.map((r) => toCandidate(r, limits())), position, limits()) }
  }

  const createStep = (id: string, budget: Budget, affinity: readonly string[], placement: SessionRules.Placed | null): SessionRules.Step => ({
    _tag: "create",
    id,
    budget,
    affinity,
    placement,
  })

  /** A create of a session that exists: core answers it as it is now, or a Conflict on another budget. */
  const existing = async (tx: Exec, row: typeof sessions.$inferSelect, budget: Budget, rows: readonly RoomRow[] | null, t: number) => {
    const s = toSession(row)
    const again = SessionRules.step(s, createStep(s.id, budget, s.affinity, null), t)
    if (again._tag === "Unchanged") return ok(await outcomeOf(tx, s, rows))
    return err(fromRefusal(s.id, again as StepRefusal) as Conflict)
  }

  /** The outcome of a create whose id exists: the session as it is now, or a Conflict. */
  const existingOutcome = (id: string, budget: Budget, t: number) =>
    op<PlaceOutcome | null, Conflict>(
      async (tx) => {
        const [row] = await tx.select().from(sessions).where(eq(sessions.id, id))
        return row === undefined ? ok(null) : existing(tx, row, budget, null, t)
      },
      undefined,
      true,
    )

  /** Core's answer to a create that is new. */
  const created = (id: string, budget: Budget, affinity: readonly string[], placement: SessionRules.Placed | null, t: number) =>
    SessionRules.step(null, createStep(id, budget, affinity, placement), t) as SessionRules.Applied

  const queuedOutcome = (s: Session, ahead: number, hosts: readonly FleetHost[]): PlaceOutcome => ({
    _tag: "Queued",
    session: s,
    ...standingOf(s, hosts, ahead + 1, limits()),
  })

  /** A create that asked to be refused rather than queued, and fits nowhere: nothing is stored. */
  const noRoom = (id: string, budget: Budget, affinity: readonly string[], hosts: readonly FleetHost[]): NoRoom => {
    const standing = standingOf({ ...created(id, budget, affinity, null, 0).session }, hosts, 0, limits())
    return new NoRoom({ sessionId: id, noFit: standing.noFit, tooBig: standing.tooBig })
  }

  /**
   * Optimistic placement, in a batch of concurrent creates (`placeBatch`): core decides on the
   * known rows, one statement writes if the chosen host is still at the version decided on. A
   * lost race decides again in a later batch, on a read that starts after it; after
   * `maxCasAttempts` the caller falls back to the locking path (null). No fit on a fresh read:
   * the session is queued (or refused).
   */
  const createOptimistic = (id: string, budget: Budget, affinity: readonly string[], onNoRoom: OnNoRoom, t: number) =>
    Effect.gen(function* () {
      let fresh = false
      for (let attempt = 0; attempt < options.maxCasAttempts; attempt++) {
        const answer = yield* placeGrouped({ id, budget, affinity, t, fresh })
        switch (answer._tag) {
          case "Placed": {
            const outcome: PlaceOutcome = { _tag: "Placed", session: answer.session }
            return outcome
          }
          case "Exists":
            return yield* existingOutcome(id, budget, t)
          case "Lost":
            fresh = true
            continue
          case "NoFit":
            if (!answer.fresh) {
              // A reused read may miss room freed since: no queueing without a fresh read.
              fresh = true
              continue
            }
        }
        if (onNoRoom === "refuse") {
          // Refused, not queued: nothing is stored (a session of this id may exist: answer it as it is).
          const already = yield* existingOutcome(id, budget, t)
          if (already !== null) return already
          return yield* noRoom(id, budget, affinity, cache.candidates())
        }
        const queued = created(id, budget, affinity, null, t)
        const s = queued.session
        const [written] = yield* read((exec) => query<{ n: number; ahead: number }>(exec, insertQueuedSql(s, queued.events)))
        if (Number(written?.n ?? 0) === 0) return yield* existingOutcome(id, budget, t)
        return queuedOutcome(s, Number(written?.ahead ?? 0), cache.candidates())
      }
      return null
    })

  /**
   * The locking placement (the fallback when optimistic attempts keep losing): read room,
   * choose with core, lock the chosen host and re-check it with core under the lock, write.
   */
  const createLocked = (id: string, budget: Budget, affinity: readonly string[], onNoRoom: OnNoRoom, t: number) =>
    op<PlaceOutcome, Conflict | NoRoom>(async (tx) => {
      const [found, rows] = await both(
        () => tx.select().from(sessions).where(eq(sessions.id, id)),
        () => readRoom(tx, { columns: "room" }),
      )
      if (found[0] !== undefined) return existing(tx, found[0], budget, rows, t)
      const picked = await pickAndLock(tx, { budget, affinity }, limits(), { rows })
      if (picked._tag === "Chosen") {
        const answer = created(id, budget, affinity, { hostId: picked.hostId, reservationId: randomUUID() }, t)
        const s = answer.session
        const e = (answer.ledger[0] as PlaceItem["entry"]).entry
        const [written] = await query<{ n: number }>(
          tx,
          sql`with s as (${insertSessionSql(s)}),
          r as (
            insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, created_at, last_heartbeat_at)
            select ${e.id}, ${e.hostId}, ${e.ownerKind}, s.id, ${e.memMib}, ${e.vcpus}, ${e.createdAt}, ${e.lastHeartbeatAt} from s
            returning host_id, mem_mib, vcpus
          ), h as (${hostSumsSql("+", sql`r`)}),
          ev as (${newEventsSql(sql`s`, answer.events, t)}),
          m as (${bumpMetricSql("total_reserved_mib", sql`sum(mem_mib)`, sql`r`)})
          select count(*)::int as n from s`,
        )
        // Another create of the same id won: answer as a repeated create.
        if (Number(written?.n ?? 0) === 0) return retry
        return ok({ _tag: "Placed", session: s })
      }
      if (onNoRoom === "refuse") return err(noRoom(id, budget, affinity, picked.hosts))
      const answer = created(id, budget, affinity, null, t)
      const s = answer.session
      const [written] = await query<{ n: number; ahead: number }>(tx, insertQueuedSql(s, answer.events))
      if (Number(written?.n ?? 0) === 0) return retry
      return ok(queuedOutcome(s, Number(written?.ahead ?? 0), picked.hosts))
    })

  /** Locks the session, asks core for `op`'s step, writes it: the session as it is after. */
  const stepLocked = (id: string, step: (tx: Exec, s: Session) => Promise<SessionRules.Step>) =>
    Effect.gen(function* () {
      const t = yield* now
      return yield* op<Session, NotFound | IllegalTransition>(async (tx) => {
        const row = await lockSession(tx, id)
        if (row === undefined) return err(sessionNotFound(id))
        const s = toSession(row)
        const answer = SessionRules.step(s, await step(tx, s), t)
        if (answer._tag === "Unchanged") return ok(s)
        if (answer._tag !== "Applied") return err(fromRefusal(id, answer as StepRefusal) as IllegalTransition)
        return ok((await applyStep(tx, answer)).session)
      })
    })
  const simple = (id: string, step: SessionRules.Step) => stepLocked(id, () => Promise.resolve(step))

  /**
   * Resumes, in a batch of concurrent ones: one transaction locks the batch's sessions (in id
   * order), asks core to judge each (`judgeResume`: a park resumes warm in place), walks the
   * descended ones in order over one read of room (`QueueWalk.walk`), locks the planned hosts
   * in id order, replays the plan against their fresh sums (`QueueWalk.replay`; room changed
   * in between: plan again), and writes core's `resume` step of each; one commit for all.
   * A refused resume answers its refusal and changes nothing; the others go on.
   */
  const resumeBatch = (ids: readonly string[]) =>
    Effect.gen(function* () {
      const t = yield* now
      return yield* op<readonly ResumeAnswer[], never>(async (tx, attempt) => {
        const [locked, rows] = await both(
          () =>
            tx
              .select()
              .from(sessions)
              .where(inArray(sessions.id, [...ids]))
              .orderBy(asc(sessions.id))
              .for("update"),
          () => readRoom(tx, { columns: "room" }),
        )
        const byId = new Map(locked.map((r) => [r.id, toSession(r)]))
        const answers = new Map<string, ResumeAnswer>()
        const cold: Session[] = []
        for (const id of ids) {
          const s = byId.get(id)
          if (s === undefined) {
            answers.set(id, { _tag: "Refused", error: sessionNotFound(id) })
            continue
          }
          // Judged before the host choice: a refused resume locks no host, and a park resumes warm in place.
          const bad = SessionRules.judgeResume(s)
          if (bad) answers.set(id, { _tag: "Refused", error: fromRefusal(id, bad) as IllegalTransition })
          else if (!SessionRules.resumesWarm(s.state)) cold.push(s)
        }
        const walk = QueueWalk.walk(cold, rows.map((r) => toCandidate(r, limits())), {}, limits())
        const hostIds = [...new Set(walk.placed.map((p) => p.hostId))].sort()
        await lockHosts(tx, hostIds)
        const fresh = hostIds.length === 0 ? [] : (await readRoom(tx, { hostIds, columns: "room" })).map((r) => toCandidate(r, limits()))
        const { accepted, diverged } = QueueWalk.replay(walk.placed, fresh, limits())
        // Room changed between the read and the locks: plan again from fresh figures.
        if (diverged && attempt < 2) return retry
        const hostOf = new Map(accepted.map((p) => [p.waiting.id, p.hostId]))
        // Written host by host in id order (a warm resume writes its own host): the one lock order.
        const hostKey = (id: string) => hostOf.get(id) ?? byId.get(id)?.hostId ?? ""
        const toWrite = ids.filter((id) => byId.has(id) && !answers.has(id)).sort((x, y) => (hostKey(x) < hostKey(y) ? -1 : hostKey(x) > hostKey(y) ? 1 : 0))
        for (const id of toWrite) {
          const s = byId.get(id) as Session
          const hostId = hostOf.get(id)
          const warm = SessionRules.resumesWarm(s.state)
          const placement = warm || hostId === undefined ? null : { hostId, reservationId: randomUUID() }
          const answer = SessionRules.step(s, { _tag: "resume", placement }, t)
          if (answer._tag !== "Applied") {
            answers.set(id, { _tag: "Refused", error: fromRefusal(id, answer as StepRefusal) as IllegalTransition })
            continue
          }
          const { session } = await applyStep(tx, answer)
          answers.set(
            id,
            session.hostId !== null
              ? { _tag: "Done", outcome: { _tag: "Placed", session } }
              : { _tag: "Done", outcome: { _tag: "Queued", session, ...standingOf(session, rows.map((r) => toCandidate(r, limits())), await queuePosition(tx, session), limits()) } },
          )
        }
        return ok(ids.map((id) => answers.get(id) as ResumeAnswer))
      })
    })
  // Concurrent resumes share a transaction (up to the create batch size); resumes of one
  // session go in batches one after the other. A batch that fails is run again one by one.
  const resumes = Batcher.make<string, ResumeAnswer, Unavailable>({
    maxBatch: options.batchSize,
    maxInFlight: 1,
    windowMs: options.batchWindowMs,
    keysOf: (id) => [id],
    run: resumeBatch,
  })
  const resumeGrouped = (id: string): Effect.Effect<PlaceOutcome, NotFound | IllegalTransition | Unavailable> =>
    Effect.flatMap(resumes(id), (a) => (a._tag === "Done" ? Effect.succeed(a.outcome) : Effect.fail(a.error)))

  return {
    createSession: (input) =>
      Effect.gen(function* () {
        const bad = Validate.sessionInput(input)
        if (bad) return yield* bad
        const t = yield* now
        const budget: Budget = { memMib: input.budget.memMib, vcpus: input.budget.vcpus }
        const affinity = [...(input.affinity ?? [])]
        const onNoRoom = input.onNoRoom ?? "queue"
        if (options.maxCasAttempts > 0) {
          const optimistic = yield* createOptimistic(input.id, budget, affinity, onNoRoom, t)
          if (optimistic !== null) return optimistic
        }
        return yield* createLocked(input.id, budget, affinity, onNoRoom, t)
      }),

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
            .where(filterOf(filter))
            .orderBy(asc(sessions.createdAt), asc(sessions.id)),
        ),
        (rows) => rows.map(toSession),
      ),

    pageSessions: (filter: SessionFilter = {}, page) =>
      Effect.gen(function* () {
        const bad = Validate.filter("hostId", filter.hostId)
        if (bad) return yield* bad
        const { after, limit } = yield* Pages.check("sessions", page)
        const rows = yield* read((exec) =>
          exec
            .select()
            .from(sessions)
            .where(
              and(
                filterOf(filter),
                after === undefined ? undefined : sql`(${sessions.createdAt}, ${sessions.id}) > (${after[0]}, ${after[1]})`,
              ),
            )
            .orderBy(asc(sessions.createdAt), asc(sessions.id))
            .limit(limit + 1),
        )
        return Cursor.pageOf("sessions", rows.map(toSession), (x) => [x.createdAt, x.id], limit)
      }),

    sessionEvents: (id, page) =>
      Effect.gen(function* () {
        const { after, limit } = yield* Pages.check("events", page)
        const [found, rows] = yield* read((exec) =>
          both(
            () => exec.select({ id: sessions.id }).from(sessions).where(eq(sessions.id, id)),
            () =>
              exec
                .select()
                .from(sessionEvents)
                .where(and(eq(sessionEvents.sessionId, id), after === undefined ? undefined : gt(sessionEvents.seq, after[0])))
                .orderBy(asc(sessionEvents.seq))
                .limit(limit + 1),
          ),
        )
        if (found.length === 0) return yield* sessionNotFound(id)
        return Cursor.pageOf("events", rows.map(toSessionEvent), (e) => [e.seq], limit)
      }),

    queueStanding: (id) =>
      op<QueueStanding | null, NotFound>(
        async (tx) => {
          const [found, rows] = await both(
            () => tx.select().from(sessions).where(eq(sessions.id, id)),
            () => readRoom(tx, { columns: "room" }),
          )
          const row = found[0]
          if (row === undefined) return err(sessionNotFound(id))
          const s = toSession(row)
          if (s.state !== "queued") return ok(null)
          return ok(standingOf(s, rows.map((r) => toCandidate(r, limits())), await queuePosition(tx, s), limits()))
        },
        undefined,
        true,
      ),

    markRunning: (id) => simple(id, { _tag: "markRunning" }),
    idle: (id, mayPark) => simple(id, { _tag: "idle", mayPark }),
    unpark: (id) => simple(id, { _tag: "unpark" }),
    beginDescent: (id, options = {}) => simple(id, { _tag: "beginDescent", reason: options.reason ?? null }),
    finishDescent: (id) => simple(id, { _tag: "finishDescent" }),
    endSession: (id) =>
      stepLocked(id, async (tx) => {
        const open = await lockOpenMove(tx, id)
        return { _tag: "end", openMove: open === undefined ? null : toMove(open) }
      }),

    resume: (id) => resumeGrouped(id),
  }
}
