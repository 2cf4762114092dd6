/**
 * Sessions: creates, reads, and every state change of a session by itself (SPEC §2). Every
 * change reads a snapshot, asks core's `Session.step` for a plan, and hands it to the apply
 * (`Apply.ts`). A state change locks the session first; an idle session's step reads its host
 * from the host cache and the budgets waiting in the queue (one grouped read), nothing else. New
 * sessions are placed in groups: concurrent creates are gathered (`Batcher.ts`), core walks the
 * group in order over the host cache (`QueueWalk`), and one statement applies every plan, each
 * only while its host is still at the version core decided on. A create that keeps losing that
 * race decides under a host lock instead; one that fits nowhere on a fresh read is queued (or
 * refused). Creates and cold resumes skip the hosts core claims for starving sessions
 * (`QueueWalk.claims`, read through the host cache's `claims`): no new session and no resumed
 * one is ever a claim's holder, so only the queue drain places on a claimed host.
 */
import { randomUUID } from "node:crypto"
import { Lifetime, ParkGate, Placement, Plan, QueueWalk, Session } from "@engram/core"
import type { Budget, Candidate, Limits } from "@engram/core"
import { CurrentFence, Cursor, fromRefusal, NoRoom, NotFound, sessionCountsOf, Unavailable, Validate } from "@engram/store"
import type { Conflict, EndResult, IllegalTransition, OnNoRoom, PlaceOutcome, QueueStanding, SessionFilter, StoreShape } from "@engram/store"
import { and, asc, eq, gt, inArray, isNotNull, lte, ne, sql } from "drizzle-orm"
import { Effect } from "effect"
import { apply } from "./Apply.js"
import * as Batcher from "./Batcher.js"
import { anyJson, dieOnUnique, retryAfterMs, RunAgain } from "./Db.js"
import type { Conn, DbError, Transient, Tx } from "./Db.js"
import type { Deps } from "./Deps.js"
import type { Claimed } from "./HostCache.js"
import { lockAndReplay, lockOpenMove, lockSession, pickAndLock } from "./Locks.js"
import { beatBatching } from "./Reservations.js"
import type { BeatOptions } from "./Reservations.js"
import * as Pages from "./Pages.js"
import { toMove, toSession, toSessionEvent } from "./Rows.js"
import { sessionEvents, sessions } from "./schema.js"

type SessionOps = Pick<
  StoreShape,
  | "createSession"
  | "getSession"
  | "getSessions"
  | "listSessions"
  | "countSessions"
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
  | "setTtl"
  | "recordGuestLost"
  | "recordActivity"
  | "lifetimesDue"
>

/**
 * `countSessions`' statement: the live sessions by state, through their partial index (migration
 * 0018), so the ended history (which can outnumber them many times over) is never read.
 */
export const countSessionsSql = sql`select state, count(*)::int as n from sessions where state <> 'ended' group by state`

/** One host's report of the sessions whose guests did work, at `t`. */
interface ActivityItem {
  readonly hostId: string
  readonly sessionIds: readonly string[]
  readonly t: number
}

/** Options of the placement of new sessions. */
export interface PlacementOptions {
  /** See `StorePg.StoreOptions.optimisticPlacementAttempts`. */
  readonly maxCasAttempts: number
  /** See `StorePg.StoreOptions.placementBatchSize`. */
  readonly batchSize: number
  /** See `StorePg.StoreOptions.placementBatchWindowMs`. */
  readonly batchWindowMs: number
  /** See `StorePg.StoreOptions.groupHoldBoundMs`. */
  readonly holdBoundMs?: number | undefined
  /** See `StorePg.StoreOptions.placementWindowByReplicas`. */
  readonly windowByReplicas?: boolean | undefined
}

/** The longest a create group's window grows with the replicas placing (`windowByReplicas`), in ms. */
const maxGrownWindowMs = 20

const sessionNotFound = (id: string) => new NotFound({ entity: "session", id })

/** The SQL of a session filter: its state and its host. */
const filterOf = (filter: SessionFilter) =>
  and(
    filter.state === undefined ? undefined : eq(sessions.state, filter.state),
    filter.hostId === undefined ? undefined : eq(sessions.hostId, filter.hostId),
    filter.imageHostId === undefined ? undefined : eq(sessions.imageHostId, filter.imageHostId),
  )

/** The 1-based FIFO position of a queued session. */
export const queuePosition = <E>(conn: Conn<E>, s: Pick<Session.Record, "id" | "queuedAt">): Effect.Effect<number, E> =>
  s.queuedAt === null
    ? Effect.succeed(0)
    : Effect.map(
        conn.query<{ n: number }>(sql`select count(*)::int as n from sessions
          where state = 'queued' and (queued_at < ${s.queuedAt} or (queued_at = ${s.queuedAt} and id <= ${s.id}))`),
        (rows) => Number(rows[0]?.n ?? 0),
      )

/** Where a queued session stands among `hosts` at `now` (core's no-fit details, a silent host's included, and `too_big`), at `position`. */
export const standingOf = (s: Session.Record, hosts: readonly Candidate[], position: number, limits: Limits.Limits, now: number): QueueStanding => ({
  position,
  noFit: Placement.noFit(hosts, { budget: s.budget, affinity: s.affinity, now }, limits),
  tooBig: Placement.tooBigFor(hosts, limits)(s.budget),
})

/** A new session waiting in a group of creates (core's walk sees its budget, affinity and template). */
interface CreateItem {
  readonly id: string
  readonly budget: Budget
  readonly affinity: readonly string[]
  readonly template: string | null
  readonly life: CreateOptions
  /** The create's time (the store's, `Deps.now`, when it was called). */
  readonly t: number
  /** Whether it needs a read that starts after it (it found no fit on a reused read, or lost a race). */
  readonly fresh: boolean
}

/** What a group answered one create. */
type CreateAnswer =
  | { readonly _tag: "Placed"; readonly session: Session.Record }
  | { readonly _tag: "Exists" }
  /** The host core chose changed before the write (another writer): decide again. */
  | { readonly _tag: "Lost" }
  /** Fits nowhere on the read the group decided on (`fresh`: a read that started after the create). */
  | { readonly _tag: "NoFit"; readonly fresh: boolean }

/** What a group of resumes answered one resume: its outcome, or its refusal (nothing changed for it). */
type ResumeAnswer =
  | { readonly _tag: "Done"; readonly outcome: PlaceOutcome }
  | { readonly _tag: "Refused"; readonly error: NotFound | IllegalTransition }

/** A create's options beyond its budget and affinity (validated): its lifetimes and its template. */
interface CreateOptions {
  readonly idleTimeoutMs?: number | undefined
  readonly ttlMs?: number | undefined
  readonly template?: string | undefined
}
const noLifetimes: CreateOptions = {}

/** A create as the store was asked it: what placement reads, and core's step as sent (what a repeat of an existing id is judged by). */
interface CreateRequest {
  readonly id: string
  readonly budget: Budget
  /** The preferred hosts (none when not given). */
  readonly affinity: readonly string[]
  readonly life: CreateOptions
  readonly onNoRoom: OnNoRoom
  /** The create step with only the options the caller gave, no placement (`Session.repeatDiffers`). */
  readonly asked: Session.Step
}

const createStep = (
  id: string,
  budget: Budget,
  affinity: readonly string[] | undefined,
  placement: Session.Placed | null,
  life: CreateOptions = noLifetimes,
  onNoRoom?: OnNoRoom,
): Session.Step => ({
  _tag: "create",
  id,
  budget,
  affinity,
  placement,
  idleTimeoutMs: life.idleTimeoutMs,
  ttlMs: life.ttlMs,
  template: life.template,
  onNoRoom,
})

/** Core's plan of a create that is new. */
const created = (id: string, budget: Budget, affinity: readonly string[], life: CreateOptions, placement: Session.Placed | null, t: number) =>
  Session.step(null, createStep(id, budget, affinity, placement, life), t) as Plan.Plan

/** The session a step's plan writes (it writes exactly one). */
const written = (plan: Plan.Plan): Session.Record => Plan.sessionOf(plan) as Session.Record

/** The session operations of the store. */
export const make = ({ db, limits, park, now, cache, both }: Deps, options: PlacementOptions, beats: BeatOptions = {}): SessionOps => {
  // Guest activity rides on every agent's report: many hosts' activity is written by one
  // statement, as their reports are (`beatBatching`). Not a state change (no step): only the idle
  // clock of each host's running sessions moves, never back.
  const activity = Batcher.make<ActivityItem, number, DbError>({
    ...beatBatching(beats),
    name: "activity",
    keysOf: (i) => [i.hostId],
    run: (items) =>
      Effect.map(
        db.pool.query<{ k: number; n: number }>(sql`with b as (
            select * from jsonb_to_recordset(${JSON.stringify(items.flatMap((i, k) => i.sessionIds.map((sid) => ({ k, hid: i.hostId, sid, t: i.t }))))}::jsonb)
              as b(k int, hid text, sid text, t bigint)
          ),
          touched as (
            update ${sessions} s set last_active_at = b.t from b
            where s.id = b.sid and s.host_id = b.hid and s.state = 'running' and s.last_active_at < b.t
            returning b.k
          )
          select k, count(*)::int as n from touched group by k`),
        (rows) => {
          const n = new Map(rows.map((r) => [Number(r.k), Number(r.n)]))
          return items.map((_, k) => n.get(k) ?? 0)
        },
      ),
  })
  /** The hosts claimed for starving sessions now: creates and cold resumes (never a holder) skip them. */
  const claimed = Effect.flatMap(now, (t) => cache.claims(t, park.options.starvationLimitMs))
  const unclaimed = (hosts: readonly Candidate[], held: Claimed): readonly Candidate[] => (held.size === 0 ? hosts : hosts.filter((h) => !held.has(h.id)))

  /** The host cache brought up to date unless its last read is recent enough (`placementReadMaxAgeMs`). */
  const known = (fresh: boolean): Effect.Effect<boolean, Unavailable> =>
    !fresh && cache.isRecent() ? Effect.succeed(false) : Effect.as(cache.refresh(performance.now()), true)

  /**
   * A group of creates, placed together: one read of room (one that starts after every create
   * of the group, or the reused one), core's walk of the group in order over it, core's plan for
   * each placement, and one statement applying them all.
   */
  const placeGroup = (items: readonly CreateItem[]): Effect.Effect<readonly CreateAnswer[], DbError> =>
    Effect.gen(function* () {
      const fresh = yield* known(items.some((i) => i.fresh))
      const walk = cache.plan(items, yield* claimed, yield* now)
      const answers = new Map<CreateItem, CreateAnswer>()
      for (const i of walk.unplaced) answers.set(i, { _tag: "NoFit", fresh })
      const plans = walk.placed.map(({ waiting: i, hostId }) => {
        const version = cache.get(hostId)?.row.version ?? 0
        return created(i.id, i.budget, i.affinity, i.life, { hostId, version, reservationId: randomUUID() }, i.t)
      })
      const outcomes = yield* apply(db.pool, cache, plans)
      outcomes.forEach((o, k) => {
        const item = (walk.placed[k] as QueueWalk.Planned<CreateItem>).waiting
        answers.set(item, o._tag === "Applied" ? { _tag: "Placed", session: written(plans[k] as Plan.Plan) } : o.stale === "session" ? { _tag: "Exists" } : { _tag: "Lost" })
      })
      return items.map((i) => answers.get(i) ?? { _tag: "Lost" })
    })

  // Concurrent creates of this store are gathered (up to `batchSize`, for `batchWindowMs`) and
  // placed by one group at a time; creates of one session id go in groups one after the other,
  // as sequential creates would. A group whose statement failed (a unique violation: a session
  // id created concurrently by another store, or anything one create may cause) is undone
  // whole, and its creates run again one by one, so only that one fails.
  const group = Batcher.make<CreateItem, CreateAnswer, DbError>({
    name: "creates",
    maxBatch: options.batchSize,
    maxInFlight: 1,
    // Grown with the replicas placing, never past `maxGrownWindowMs` (a window is spent in busy turns of the event loop).
    windowMs: options.windowByReplicas === true ? () => Math.min(maxGrownWindowMs, options.batchWindowMs * (cache.spread()?.replicas ?? 1) ** 2) : options.batchWindowMs,
    holdBoundMs: options.holdBoundMs,
    keysOf: (i) => [i.id],
    run: (items) =>
      placeGroup(items).pipe(
        Effect.catchTag("UniqueViolation", (u) => (items.length === 1 ? Effect.succeed([{ _tag: "Exists" } as const]) : Effect.fail(u))),
      ),
    splitOn: (e) => e._tag === "UniqueViolation",
  })
  const placeGrouped = (item: CreateItem): Effect.Effect<CreateAnswer, Unavailable> =>
    group(item).pipe(
      Effect.catchTag("UniqueViolation", () => Effect.fail(new Unavailable({ reason: "unexpected unique violation", retryAfterMs }))),
    )

  /** Where a session stands now: placed, or queued with its position and the reasons no known host takes it. */
  const outcomeOf = <E>(conn: Conn<E>, s: Session.Record, t: number): Effect.Effect<PlaceOutcome, E> =>
    s.hostId !== null
      ? Effect.succeed({ _tag: "Placed", session: s })
      : Effect.map(queuePosition(conn, s), (position) => ({ _tag: "Queued", session: s, ...standingOf(s, cache.candidates(), position, limits(), t) }))

  /** A create of a session that exists: core answers it as it is now, or a Conflict naming what differs (`Session.repeatDiffers`). */
  const existing = ({ id, asked }: CreateRequest, t: number): Effect.Effect<PlaceOutcome | null, Conflict | Unavailable> =>
    Effect.gen(function* () {
      const [row] = yield* db.pool.use((exec) => exec.select().from(sessions).where(eq(sessions.id, id)))
      if (row === undefined) return null
      const s = toSession(row)
      const answer = Session.step(s, asked, t)
      if (answer._tag !== "Unchanged") return yield* (fromRefusal(id, answer as Session.Refusal) as Conflict)
      return yield* outcomeOf(db.pool, s, t)
    }).pipe(dieOnUnique)

  /** A create that asked to be refused rather than queued, and fits nowhere: nothing is stored. */
  const noRoom = (id: string, budget: Budget, affinity: readonly string[], hosts: readonly Candidate[], t: number): NoRoom => {
    const standing = standingOf(written(created(id, budget, affinity, noLifetimes, null, 0)), hosts, 0, limits(), t)
    return new NoRoom({ sessionId: id, noFit: standing.noFit, tooBig: standing.tooBig })
  }

  /** Fits nowhere on a fresh read: queued (or refused, storing nothing). */
  const queueOrRefuse = <E>(conn: Conn<E>, id: string, budget: Budget, affinity: readonly string[], life: CreateOptions, onNoRoom: OnNoRoom, t: number, hosts: readonly Candidate[]) =>
    Effect.gen(function* () {
      if (onNoRoom === "refuse") return yield* noRoom(id, budget, affinity, hosts, t)
      const plan = created(id, budget, affinity, life, null, t)
      const [outcome] = yield* apply(conn, cache, [plan])
      if (outcome?._tag !== "Applied") return null
      const s = written(plan)
      return { _tag: "Queued", session: s, ...standingOf(s, hosts, yield* queuePosition(conn, s), limits(), t) } satisfies PlaceOutcome
    })

  /**
   * Optimistic placement, in a group of concurrent creates: core decides on the cached rows,
   * the apply writes if the chosen host is still at the version decided on. A lost race decides
   * again in a later group, on a read that starts after it; after `maxCasAttempts` the caller
   * falls back to the locking choice (null). No fit on a fresh read: queued (or refused).
   */
  const createOptimistic = (r: CreateRequest, t: number) =>
    Effect.gen(function* () {
      const { id, budget, affinity, life, onNoRoom } = r
      let fresh = false
      for (let attempt = 0; attempt < options.maxCasAttempts; attempt++) {
        const answer = yield* placeGrouped({ id, budget, affinity, template: life.template ?? null, life, t, fresh })
        if (answer._tag === "Placed") return { _tag: "Placed", session: answer.session } satisfies PlaceOutcome
        if (answer._tag === "Exists") return yield* existing(r, t)
        // A lost race, or no fit on a reused read (which may miss room freed since): decide again on a fresh read.
        if (answer._tag === "Lost" || !answer.fresh) {
          fresh = true
          continue
        }
        // Refused or queued; a session of this id may exist meanwhile: answer it as it is.
        const already = yield* existing(r, t)
        if (already !== null) return already
        const queued = yield* queueOrRefuse(db.pool, id, budget, affinity, life, onNoRoom, t, cache.candidates()).pipe(
          Effect.catchTag("UniqueViolation", () => Effect.succeed(null)),
        )
        return queued ?? (yield* existing(r, t))
      }
      return null
    })

  /**
   * The locking placement (when optimistic attempts keep losing, or are off): choose with core
   * on the cached rows, lock the chosen host and re-check it with core under the lock, apply.
   */
  const createLocked = (r: CreateRequest, t: number) =>
    Effect.gen(function* () {
      const { id, budget, affinity, life, onNoRoom } = r
      const already = yield* existing(r, t)
      if (already !== null) return already
      yield* known(true)
      const held = yield* claimed
      const outcome = yield* db
        .transaction((tx) =>
          Effect.gen(function* () {
            const all = cache.candidates()
            const picked = yield* pickAndLock(tx, { budget, affinity, template: life.template, now: t }, limits(), unclaimed(all, held))
            // Its standing is judged among every host, the claimed ones too.
            if (picked._tag === "NoFit") return yield* queueOrRefuse(tx, id, budget, affinity, life, onNoRoom, t, held.size === 0 ? picked.hosts : [...picked.hosts, ...all.filter((c) => held.has(c.id))])
            const plan = created(id, budget, affinity, life, { hostId: picked.hostId, version: picked.version, reservationId: randomUUID() }, t)
            const [o] = yield* apply(tx, cache, [plan])
            // Another create of the same id won: answered below as a repeated create.
            return o?._tag === "Applied" ? ({ _tag: "Placed", session: written(plan) } satisfies PlaceOutcome) : null
          }),
        )
        .pipe(Effect.catchTag("UniqueViolation", () => Effect.succeed(null)))
      return outcome ?? (yield* existing(r, t)) ?? (yield* new Unavailable({ reason: "the session's create raced another; retry", retryAfterMs, kind: "contended" }))
    })

  /**
   * Locks the session, asks core for `op`'s plan on what `read` reads, applies it: the session as
   * the lock found it, as it is after, and the plan written (null: nothing changed).
   */
  const stepLockedWith = (id: string, read: (tx: Tx, s: Session.Record) => Effect.Effect<Session.Step, DbError | Transient>) =>
    Effect.gen(function* () {
      const t = yield* now
      return yield* db.transaction((tx) =>
        Effect.gen(function* () {
          const row = yield* lockSession(tx, id)
          if (row === undefined) return yield* sessionNotFound(id)
          const s = toSession(row)
          const answer = Session.step(s, yield* read(tx, s), t)
          if (answer._tag === "Unchanged") return { before: s, after: answer.session, plan: null }
          if (answer._tag !== "Plan") return yield* (fromRefusal(id, answer as Session.Refusal) as IllegalTransition)
          const [outcome] = yield* apply(tx, cache, [answer])
          if (outcome?._tag !== "Applied") return yield* new RunAgain({ why: "the session changed under its lock" })
          return { before: s, after: written(answer), plan: answer }
        }),
      )
    }).pipe(dieOnUnique)
  /** As `stepLockedWith`: the session as it is after. */
  const stepLocked = (id: string, read: (tx: Tx, s: Session.Record) => Effect.Effect<Session.Step, DbError | Transient>) =>
    Effect.map(stepLockedWith(id, read), (r) => r.after)
  const simple = (id: string, step: Session.Step) => stepLocked(id, () => Effect.succeed(step))

  /**
   * An idle session's step: parked or descending as the park policy decides on what it reads —
   * its host as the cache knows it, and whether a budget waiting in the queue fits on no known
   * host (too-big ones aside). The queue is read as its distinct budgets, in the transaction.
   */
  const idle = (id: string, options: { readonly onlyIfDue?: boolean | undefined } = {}) =>
    Effect.andThen(Effect.zip(known(false), now), ([, t]) =>
      stepLocked(id, (tx, s) =>
        Effect.map(
          tx.query<{ mem_mib: number; vcpus: number }>(sql`select mem_mib, vcpus from sessions where state = 'queued' group by mem_mib, vcpus`),
          (rows): Session.Step => ({
            _tag: "idle",
            onlyIfDue: options.onlyIfDue,
            policy: park,
            view: {
              host: s.hostId === null ? null : (cache.get(s.hostId)?.candidate ?? null),
              queueWithoutRoom: ParkGate.anyWithoutRoom(
                rows.map((r) => ({ memMib: Number(r.mem_mib), vcpus: Number(r.vcpus) })),
                (b) => cache.anyFits(b, t),
                cache.tooBig,
              ),
            },
          }),
        ),
      ),
    )

  /**
   * Resumes, in a group of concurrent ones: one transaction locks the group's sessions (in id
   * order), asks core to judge each (`judgeResume`: a park resumes warm in place), walks the
   * descended ones in order over the host cache (`QueueWalk.walk`), locks the planned hosts in
   * id order, replays the walk against their fresh sums (`QueueWalk.replay`; room changed in
   * between: decide again), and applies core's `resume` plans as one group. A refused resume
   * answers its refusal and changes nothing; the others go on.
   */
  const resumeGroup = (ids: readonly string[]) =>
    Effect.gen(function* () {
      const t = yield* now
      yield* known(false)
      const held = yield* claimed
      let runs = 0
      return yield* db.transaction((tx) =>
        Effect.gen(function* () {
          runs++
          const locked = yield* tx.use((exec) =>
            exec
              .select()
              .from(sessions)
              .where(inArray(sessions.id, [...ids]))
              .orderBy(asc(sessions.id))
              .for("update"),
          )
          const byId = new Map(locked.map((r) => [r.id, toSession(r)]))
          const answers = new Map<string, ResumeAnswer>()
          const cold: Session.Record[] = []
          for (const id of ids) {
            const s = byId.get(id)
            if (s === undefined) {
              answers.set(id, { _tag: "Refused", error: sessionNotFound(id) })
              continue
            }
            // Judged before the host choice: a refused resume locks no host, and a park resumes warm in place.
            const bad = Session.judgeResume(s)
            if (bad) answers.set(id, { _tag: "Refused", error: fromRefusal(id, bad) as IllegalTransition })
            else if (!Session.resumesWarm(s.state)) cold.push(s)
          }
          const hosts = cache.candidates()
          const walk = QueueWalk.walk(cold, unclaimed(hosts, held), { now: t }, limits())
          const { accepted, versionOf } = yield* lockAndReplay(tx, walk.placed, limits(), runs)
          const hostOf = new Map(accepted.map((p) => [p.waiting.id, p.hostId]))
          const plans: Plan.Plan[] = []
          for (const id of ids) {
            const s = byId.get(id)
            if (s === undefined || answers.has(id)) continue
            const hostId = hostOf.get(id)
            const placement = Session.resumesWarm(s.state) || hostId === undefined ? null : { hostId, version: versionOf.get(hostId) as number, reservationId: randomUUID() }
            const answer = Session.step(s, { _tag: "resume", placement }, t)
            if (answer._tag === "Plan") plans.push(answer)
            else answers.set(id, { _tag: "Refused", error: fromRefusal(id, answer as Session.Refusal) as IllegalTransition })
          }
          const outcomes = yield* apply(tx, cache, plans)
          if (outcomes.some((o) => o._tag !== "Applied")) return yield* new RunAgain({ why: "a resumed session or its host changed under its lock" })
          for (const plan of plans) {
            const s = written(plan)
            const outcome: PlaceOutcome =
              s.hostId !== null ? { _tag: "Placed", session: s } : { _tag: "Queued", session: s, ...standingOf(s, hosts, yield* queuePosition(tx, s), limits(), t) }
            answers.set(s.id, { _tag: "Done", outcome })
          }
          return ids.map((id) => answers.get(id) as ResumeAnswer)
        }),
      )
    }).pipe(dieOnUnique)
  // Concurrent resumes share a transaction (up to the create group size); resumes of one
  // session go in groups one after the other. A group that fails is run again one by one.
  const resumes = Batcher.make<string, ResumeAnswer, Unavailable>({
    name: "resumes",
    maxBatch: options.batchSize,
    maxInFlight: 1,
    windowMs: options.batchWindowMs,
    holdBoundMs: options.holdBoundMs,
    keysOf: (id) => [id],
    run: resumeGroup,
  })

  return {
    createSession: (input) =>
      Effect.gen(function* () {
        const bad = Validate.sessionInput(input)
        if (bad) return yield* bad
        const t = yield* now
        const budget: Budget = { memMib: input.budget.memMib, vcpus: input.budget.vcpus }
        const affinity = [...(input.affinity ?? [])]
        const onNoRoom = input.onNoRoom ?? "queue"
        const life: CreateOptions = { idleTimeoutMs: input.idleTimeoutMs, ttlMs: input.ttlMs, template: input.template }
        // As sent: a repeated create compares only what its caller gave.
        const asked = createStep(input.id, budget, input.affinity, null, life, input.onNoRoom)
        const request: CreateRequest = { id: input.id, budget, affinity, life, onNoRoom, asked }
        // A group runs in the context of the create that opened it, so a create under a lease
        // (`CurrentFence`) is placed alone, behind its own fence, never in a group.
        const fenced = (yield* Effect.service(CurrentFence)) !== null
        if (options.maxCasAttempts > 0 && !fenced) {
          const optimistic = yield* createOptimistic(request, t)
          if (optimistic !== null) return optimistic
        }
        return yield* createLocked(request, t)
      }),

    getSession: (id) =>
      Effect.flatMap(
        db.pool.use((exec) => exec.select().from(sessions).where(eq(sessions.id, id))),
        (rows) => (rows[0] === undefined ? Effect.fail(sessionNotFound(id)) : Effect.succeed(toSession(rows[0]))),
      ).pipe(dieOnUnique),

    // One statement whatever the number of ids: they travel as one jsonb parameter, so the text
    // is constant (prepared once per connection); the rows come by the primary key.
    getSessions: (ids) => {
      const unique = [...new Set(ids)]
      if (unique.length === 0) return Effect.succeed([])
      return Effect.map(
        db.pool.use((exec) => exec.select().from(sessions).where(anyJson(sessions.id, unique))),
        (rows) => rows.map(toSession),
      ).pipe(dieOnUnique)
    },

    listSessions: (filter: SessionFilter = {}) =>
      Effect.map(
        db.pool.use((exec) =>
          exec
            .select()
            .from(sessions)
            .where(filterOf(filter))
            .orderBy(asc(sessions.createdAt), asc(sessions.id)),
        ),
        (rows) => rows.map(toSession),
      ).pipe(dieOnUnique),

    countSessions: () => Effect.map(db.pool.query<{ state: string; n: number }>(countSessionsSql), sessionCountsOf).pipe(dieOnUnique),

    pageSessions: (filter: SessionFilter = {}, page) =>
      Effect.gen(function* () {
        const bad = Validate.filter("hostId", filter.hostId)
        if (bad) return yield* bad
        const { after, limit } = yield* Pages.check("sessions", page)
        const rows = yield* db.pool.use((exec) =>
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
      }).pipe(dieOnUnique),

    sessionEvents: (id, page) =>
      Effect.gen(function* () {
        const { after, limit } = yield* Pages.check("events", page)
        const [found, rows] = yield* db.transaction((tx) =>
          both(
            tx.use((exec) => exec.select({ id: sessions.id }).from(sessions).where(eq(sessions.id, id))),
            tx.use((exec) =>
              exec
                .select()
                .from(sessionEvents)
                .where(and(eq(sessionEvents.sessionId, id), after === undefined ? undefined : gt(sessionEvents.seq, after[0])))
                .orderBy(asc(sessionEvents.seq))
                .limit(limit + 1),
            ),
          ),
        )
        if (found.length === 0) return yield* sessionNotFound(id)
        return Cursor.pageOf("events", rows.map(toSessionEvent), (e) => [e.seq], limit)
      }).pipe(dieOnUnique),

    queueStanding: (id) =>
      Effect.gen(function* () {
        yield* known(false)
        const [row] = yield* db.pool.use((exec) => exec.select().from(sessions).where(eq(sessions.id, id)))
        if (row === undefined) return yield* sessionNotFound(id)
        const s = toSession(row)
        if (s.state !== "queued") return null
        return standingOf(s, cache.candidates(), yield* queuePosition(db.pool, s), limits(), yield* now)
      }).pipe(dieOnUnique),

    markRunning: (id) => simple(id, { _tag: "markRunning" }),
    idle,
    unpark: (id) => simple(id, { _tag: "unpark" }),
    beginDescent: (id, options = {}) => simple(id, { _tag: "beginDescent", reason: options.reason ?? null }),
    finishDescent: (id, options = {}) => simple(id, { _tag: "finishDescent", imageless: options.imageless }),
    endSession: (id, options = {}) =>
      Effect.gen(function* () {
        const bad = options.reason === undefined ? null : Validate.reason(options.reason)
        if (bad) return yield* bad
        const reason = options.reason ?? null
        // The move the end closes is read under the session's lock, in the end's own transaction.
        const ended = yield* stepLockedWith(id, (tx) =>
          Effect.map(lockOpenMove(tx, id), (open): Session.Step => ({ _tag: "end", openMove: open === undefined ? null : toMove(open), reason, onlyIfDue: options.onlyIfDue })),
        )
        return { session: ended.after, before: ended.before, closedMove: ended.plan === null ? null : Plan.moveOf(ended.plan) } satisfies EndResult
      }),
    setTtl: (id, ttlMs) =>
      Effect.gen(function* () {
        const bad = Validate.ttl(ttlMs)
        if (bad) return yield* bad
        return yield* simple(id, { _tag: "setTtl", ttlMs })
      }),
    recordGuestLost: (hostId, sessionId, reason) =>
      Effect.gen(function* () {
        const bad = Validate.guestLost(hostId, reason)
        if (bad) return yield* bad
        // A session no longer on the host is judged on its latest committed move (a report of a
        // copy lost there before it): its last `Moved` event, read in the step's transaction
        // (walking the history's primary key backwards from its newest entry).
        return yield* stepLocked(sessionId, (tx, s) =>
          s.hostId === hostId
            ? Effect.succeed<Session.Step>({ _tag: "guestLost", hostId, reason })
            : Effect.map(
                tx.query<{ move_id: string; from_host_id: string; to_host_id: string; revisited: boolean }>(
                  sql`select m.event->>'moveId' as move_id, m.event->>'fromHostId' as from_host_id, m.event->>'toHostId' as to_host_id,
                        exists (select 1 from session_events e where e.session_id = ${sessionId} and e.seq > m.seq and e.event->>'hostId' = ${hostId}) as revisited
                      from (select seq, event from session_events where session_id = ${sessionId} and event->>'_tag' = 'Moved' order by seq desc limit 1) m`,
                ),
                (rows): Session.Step => {
                  const m = rows[0]
                  return {
                    _tag: "guestLost",
                    hostId,
                    reason,
                    lastMove: m === undefined ? null : { moveId: m.move_id, fromHostId: m.from_host_id, toHostId: m.to_host_id, revisited: m.revisited },
                  }
                },
              ),
        )
      }),
    recordActivity: (hostId, sessionIds) =>
      Effect.gen(function* () {
        const bad = Validate.id("hostId", hostId) ?? Validate.activity(sessionIds)
        if (bad) return yield* bad
        if (sessionIds.length === 0) return 0
        return yield* activity({ hostId, sessionIds, t: yield* now })
      }).pipe(dieOnUnique),
    lifetimesDue: (options = {}) =>
      Effect.gen(function* () {
        const t = yield* now
        const limit = options.limit ?? 1000
        // Both reads walk their partial index (sessions_idle_idx, sessions_ends_idx) up to now.
        const [idleRows, expiredRows] = yield* both(
          db.pool.use((exec) =>
            exec
              .select()
              .from(sessions)
              .where(and(eq(sessions.state, "running"), isNotNull(sessions.idleTimeoutMs), sql`(${sessions.lastActiveAt} + ${sessions.idleTimeoutMs}) <= ${t}`))
              .orderBy(sql`(${sessions.lastActiveAt} + ${sessions.idleTimeoutMs})`, asc(sessions.id))
              .limit(limit),
          ),
          db.pool.use((exec) =>
            exec
              .select()
              .from(sessions)
              .where(and(isNotNull(sessions.endsAt), ne(sessions.state, "ended"), lte(sessions.endsAt, t)))
              .orderBy(asc(sessions.endsAt), asc(sessions.id))
              .limit(limit),
          ),
        )
        // Core has the last word: the reads only find the candidates.
        const expired = expiredRows.map(toSession).filter((s) => Lifetime.isExpired(s, t))
        const ended = new Set(expired.map((s) => s.id))
        const idle = idleRows.map(toSession).filter((s) => !ended.has(s.id) && Lifetime.isIdle(s, s.lastActiveAt, t))
        return { idle, expired }
      }).pipe(dieOnUnique),

    resume: (id) =>
      Effect.flatMap(
        // As creates: a resume under a lease runs alone, behind its own fence (a group runs in the context of its first caller).
        Effect.flatMap(Effect.service(CurrentFence), (fence) => (fence === null ? resumes(id) : Effect.map(resumeGroup([id]), (answers) => answers[0] as ResumeAnswer))),
        (a) => (a._tag === "Done" ? Effect.succeed(a.outcome) : Effect.fail(a.error)),
      ),
  }
}
