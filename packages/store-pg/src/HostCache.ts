/**
 * The host-room cache: the one copy of the fleet this store keeps in memory — every host's row
 * (its room, at its version) with core's candidate and core's placement index over them, and
 * the sessions the fleet view carries (parks, descents, the queue). Placements decide on it,
 * the idle decision reads it, the fleet view is built from it. It decides nothing: core's index
 * picks, and the version a plan relies on keeps every write safe (`Apply.ts`).
 *
 * **The one rule.** A row is replaced only by a newer version of itself, and learned from one
 * of two places: this store's own writes (the apply answers the host rows it wrote; they are
 * learned once their transaction has committed, never from a transaction that may still roll
 * back) and reads of what changed. A read asks PostgreSQL for the rows written by transactions
 * at or after the oldest one still running when the previous read ran (its snapshot's `xmin`),
 * so it sees every replica's writes, and ships only what changed. Rows removed (a host removed,
 * a reset) are caught by counting: when the counts differ from what the cache holds after a
 * read, everything is read whole again. Host rows are read on their own when a placement needs
 * fresh figures (`refresh`: callers that arrive while a read runs share the next one), and
 * together with the fleet's sessions for the fleet view (`fleet`). Nothing expires by time:
 * `maxReadAgeMs` only says how old a read a placement may decide on (`isRecent`).
 *
 * **Claims.** Creates and cold resumes skip the hosts core claims for starving sessions
 * (`QueueWalk.claims`, SPEC §2's bound on waiting). A claim is a function of the queue and the
 * hosts, so every replica finds the same one from the same reads; no replica tells another.
 * Claims exist only once the queue's head has waited the starvation limit, so the cache
 * remembers until when none can (`quietUntil`: the head's queue time, or the read's time when
 * the queue was empty or its head newer, plus the limit; a session queued later queues at or
 * after that read). Before then a placement reads nothing more; after, each group of creates or
 * resumes reads the starving part of the queue once (an index range scan of `sessions_queue_idx`)
 * and core judges it over the cached hosts. A stale read never over-commits (every write still
 * holds only at the host version decided on, or under the host's lock): at worst one placement
 * lands on a host claimed a moment before, or keeps off one whose claim just ended.
 */
import { Order, PlacementIndex, Placement, QueueWalk } from "@engram/core"
import type { Budget, Candidate, FleetHost, Limits, Park, Queued } from "@engram/core"
import type { FleetRead, Unavailable } from "@engram/store"
import { sql } from "drizzle-orm"
import type { SQL } from "drizzle-orm"
import { Deferred, Effect, Exit, Request, RequestResolver, Semaphore } from "effect"
import type { Conn } from "./Db.js"
import { hostColumns, json, num, numOrNull, toCandidate, toHostRow } from "./HostRows.js"
import type { HostRow } from "./HostRows.js"

/** A known host: its newest committed row and core's candidate for it. */
export interface Known {
  readonly row: HostRow
  readonly candidate: Candidate
}

/** The session states the fleet view carries. */
const fleetStates = ["parked", "descending", "queued"] as const
type FleetState = (typeof fleetStates)[number]
const isFleetState = (s: string): s is FleetState => (fleetStates as readonly string[]).includes(s)

interface SessionLite {
  readonly id: string
  readonly state: FleetState
  readonly hostId: string | null
  readonly parkedAt: number | null
  readonly queuedAt: number | null
  readonly memMib: number
  readonly vcpus: number
}

interface Entry {
  row: HostRow
  candidate: Candidate
  readonly parks: Map<string, Park>
  readonly descents: Set<string>
  /** The host as the fleet view carries it; null once anything it shows changed. */
  fleet: FleetHost | null
  /** Its parks, oldest first, as the fleet view carries them; null once a park came or went. */
  parkList: Park[] | null
}

interface Delta {
  readonly xmin: string
  /** The placing stores connected now (sorted), when this store spreads its placements. */
  readonly placers?: readonly string[]
  readonly hostCount: number
  readonly hosts: Record<string, unknown>[]
  /** Absent on a read of hosts alone. */
  readonly sessions?: { readonly count: number; readonly rows: Record<string, unknown>[] }
}


// Row xmin is a 32-bit xid: compare by age (the distance back from now), wraparound-safe.
const writtenSince = (since: string | null): SQL =>
  since === null ? sql`true` : sql`age(xmin) <= age(${String(BigInt(since) % 4294967296n)}::xid)`

/**
 * The `application_name` prefix of the connections of a store that spreads its placements: the
 * stores placing on one database find each other by it (`pg_stat_activity`), with no table.
 */
export const placerPrefix = "engram-placer "

/**
 * The statement: the snapshot's xmin, the count of hosts and the hosts written since
 * `hostsSince` (every host when null), and — for the fleet view — the count of fleet sessions
 * and those written since `sessionsSince` (every fleet session when null). With `placers`, the
 * placing stores connected to this database now, by name (`placerPrefix`), sorted.
 */
export const deltaSql = (hostsSince: string | null, sessionsSince?: string | null, placers = false): SQL => {
  const found = placers
    ? sql`(select coalesce(json_agg(distinct application_name order by application_name), '[]'::json) from pg_stat_activity
        where starts_with(application_name, ${placerPrefix}) and datname = current_database()) as placers,`
    : sql``
  const hosts = sql`${found} (select count(*)::int from hosts) as "hostCount",
    (select coalesce(json_agg(x), '[]'::json) from (
      select ${hostColumns("h", "room")}, 0 as "parks", 0 as "descents" from hosts h where ${writtenSince(hostsSince)}
    ) x) as hosts`
  if (sessionsSince === undefined) return sql`select pg_snapshot_xmin(pg_current_snapshot())::text as xmin, ${hosts}`
  const changed = sessionsSince === null ? sql`state in ('parked', 'descending', 'queued')` : writtenSince(sessionsSince)
  // One pass over the sessions gives both their count and the changed ones.
  return sql`select pg_snapshot_xmin(pg_current_snapshot())::text as xmin, ${hosts}, s.n as "sessionCount", s.list as sessions
    from (
      select (count(*) filter (where state in ('parked', 'descending', 'queued')))::int as n,
        coalesce(json_agg(json_build_object('id', id, 'state', state, 'hostId', host_id, 'parkedAt', parked_at,
          'queuedAt', queued_at, 'memMib', mem_mib, 'vcpus', vcpus)) filter (where ${changed}), '[]'::json) as list
      from sessions
    ) s`
}

/** The cache's operations. */
export interface HostCache {
  /** The known row of a host. */
  readonly get: (id: string) => Known | undefined
  /** Every known host as placement sees it. */
  readonly candidates: () => Candidate[]
  /**
   * Core's walk of `queue` (in order) over the known hosts, each placement taking its room
   * before the next is judged (`QueueWalk.walkOn`): a group decided on one read. The known rows
   * are left as they were (the placements are not written yet).
   */
  readonly plan: <W extends QueueWalk.Waiting>(queue: readonly W[], claimed?: Claimed, now?: number) => QueueWalk.Walk<W>
  /**
   * The hosts claimed at `t` for starving sessions (core's `QueueWalk.claims` over the known
   * hosts and the sessions queued at least `limitMs` before `t`), holder by host id. Reads the
   * starving part of the queue only when the queue's head may have waited `limitMs` (see the
   * header); otherwise none, without a read.
   */
  readonly claims: (t: number, limitMs: number) => Effect.Effect<Claimed, Unavailable>
  /** Whether `budget` fits on a known host now (core's index). */
  readonly anyFits: (budget: Budget, now?: number) => boolean
  /** Whether `budget` is too big for every ready measured known host, even empty (SPEC §12). */
  readonly tooBig: (budget: Budget) => boolean
  /** Keeps a committed row unless a newer version is known. */
  readonly learn: (row: HostRow) => void
  /** Forgets a host (removed): it is no candidate until a read shows it again. */
  readonly forget: (id: string) => void
  /** Whether the last read of the hosts is recent enough to place from (`maxReadAgeMs`). */
  readonly isRecent: () => boolean
  /** Every host's room brought up to date by a read that started at or after `since` (real ms). */
  readonly refresh: (since: number) => Effect.Effect<void, Unavailable>
  /** The fleet now (hosts, their parks and descents, the queue), brought up to date by one read. */
  readonly fleet: (readAt: number) => Effect.Effect<FleetRead, Unavailable>
  /** Forgets everything (a test reset) and decides with `limits` from now on. */
  readonly reset: (limits: Limits.Limits) => void
  /** What the fleet reads cost: whole reads and delta reads so far (for tests and the bench). */
  readonly stats: () => { readonly full: number; readonly delta: number }
  /** Counts the version checks of one apply: plans written at the host version they decided on, and plans refused for a host changed since. */
  readonly checked: (placed: number, conflicts: number) => void
  /** The version checks this store's applies met so far (`checked`). */
  readonly checks: () => PlacementChecks
  /** This store's share of the hosts as the last read found the placing stores (none: it ranks every host alike). */
  readonly spread: () => Placement.Spread | undefined
}

/** Hosts claimed for starving sessions, holder by host id: a placement other than the holder's skips them. */
export type Claimed = ReadonlyMap<string, ClaimHolder>

/** A starving session a host is claimed for: its id, budget and when it queued. */
export interface ClaimHolder extends QueueWalk.Waiting {
  readonly id: string
}
const noClaims: Claimed = new Map()

/**
 * The queued sessions that have waited since `cutoff` or longer (first in first out), then the
 * next one in line: both walk `sessions_queue_idx`.
 */
export const starvingSql = (cutoff: number): SQL =>
  sql`(select id, mem_mib as "memMib", vcpus, queued_at as "queuedAt" from sessions
      where state = 'queued' and queued_at <= ${cutoff} order by queued_at, id)
    union all
    (select id, mem_mib, vcpus, queued_at from sessions
      where state = 'queued' and queued_at > ${cutoff} order by queued_at, id limit 1)
    order by "queuedAt", id`

/**
 * The version checks of this store's placements so far: each plan that took room at the host
 * version it decided on (`placed`), and each refused because another writer changed that host
 * first (`conflicts`, every one decided again). Replicas that pick the same hosts show it here.
 */
export interface PlacementChecks {
  readonly placed: number
  readonly conflicts: number
  /** Apply statements that carried at least one placement: `placed / statements` is the mean group placed by one statement. */
  readonly statements: number
}

/**
 * Builds the cache over the pool's single statements. With `placer` (this store's
 * `application_name` on every connection of the pool, starting with `placerPrefix`), each read
 * also finds the stores placing on the database, and this one's share of the hosts among them
 * (`Placement.Spread`: its position among their sorted names) ranks first in its placements.
 */
export const make = (options: {
  readonly limits: Limits.Limits
  readonly maxReadAgeMs: number
  readonly pool: Conn<Unavailable>
  readonly placer?: string | undefined
}): HostCache => {
  let limits = options.limits
  const { maxReadAgeMs, pool, placer } = options
  let spread: Placement.Spread | undefined
  let hosts = new Map<string, Entry>()
  let sessions = new Map<string, SessionLite>()
  let index = new PlacementIndex.Index(limits)
  let sortedHosts: Entry[] | null = null
  let queue: Queued[] | null = null
  let tooBigIndex: ((b: Budget) => boolean) | null = null
  let hostsSince: string | null = null
  let sessionsSince: string | null = null
  // When the last read of the hosts started (real time, not the Clock).
  let knownAt = Number.NEGATIVE_INFINITY
  // Bumped by a reset: a read that started before it must not fill the cache after it.
  let generation = 0
  // No queued session can be starving at a Clock time in [quietFrom, quietUntil) (see the header).
  let quietFrom = Number.POSITIVE_INFINITY
  let quietUntil = Number.NEGATIVE_INFINITY
  let full = 0
  let delta = 0
  let placed = 0
  let conflicts = 0
  let statements = 0
  // One read at a time: a read's snapshot and what it learned stay in step.
  const reader = Semaphore.makeUnsafe(1)

  const clear = (): void => {
    hosts = new Map()
    sessions = new Map()
    index = new PlacementIndex.Index(limits)
    sortedHosts = null
    queue = null
    tooBigIndex = null
    hostsSince = null
    sessionsSince = null
    knownAt = Number.NEGATIVE_INFINITY
    quietFrom = Number.POSITIVE_INFINITY
    quietUntil = Number.NEGATIVE_INFINITY
  }

  // A change of capacity or state changes which budgets are too big; a change of sums does not.
  const sameSize = (a: Candidate, b: Candidate): boolean =>
    a.headroom.allocatableMib === b.headroom.allocatableMib &&
    a.headroom.cpuBudget === b.headroom.cpuBudget &&
    a.state === b.state &&
    a.measured === b.measured &&
    a.reported === b.reported

  const learn = (row: HostRow): void => {
    const e = hosts.get(row.id)
    if (e !== undefined && row.version < e.row.version) return
    const candidate = toCandidate(row, limits)
    if (e === undefined) {
      hosts.set(row.id, { row, candidate, parks: new Map(), descents: new Set(), fleet: null, parkList: null })
      sortedHosts = null
      tooBigIndex = null
    } else {
      if (!sameSize(e.candidate, candidate)) tooBigIndex = null
      e.row = row
      e.candidate = candidate
      e.fleet = null
    }
    index.upsert(candidate)
  }
  const forget = (id: string): void => {
    if (!hosts.delete(id)) return
    index.remove(id)
    sortedHosts = null
    tooBigIndex = null
  }

  const leave = (s: SessionLite): void => {
    sessions.delete(s.id)
    if (s.state === "queued") queue = null
    const h = s.hostId === null ? undefined : hosts.get(s.hostId)
    if (h === undefined) return
    if (s.state === "parked" && h.parks.delete(s.id)) h.fleet = h.parkList = null
    if (s.state === "descending" && h.descents.delete(s.id)) h.fleet = null
  }
  const enter = (s: SessionLite): void => {
    sessions.set(s.id, s)
    if (s.state === "queued") queue = null
    const h = s.hostId === null ? undefined : hosts.get(s.hostId)
    if (h === undefined) return
    if (s.state === "parked") {
      h.parks.set(s.id, { sessionId: s.id, parkedAt: s.parkedAt ?? 0, budget: { memMib: s.memMib, vcpus: s.vcpus } })
      h.fleet = h.parkList = null
    } else if (s.state === "descending") {
      h.descents.add(s.id)
      h.fleet = null
    }
  }

  /** Applies a read; false when the counts say a row went away (the cache must be read whole). */
  const take = (d: Delta): boolean => {
    if (d.placers !== undefined && placer !== undefined) {
      const replica = d.placers.indexOf(placer)
      spread = replica < 0 || d.placers.length < 2 ? undefined : { replica, replicas: d.placers.length }
    }
    for (const r of d.hosts) learn(toHostRow(r))
    hostsSince = d.xmin
    if (d.sessions !== undefined) {
      for (const r of d.sessions.rows) {
        const id = r["id"] as string
        const state = r["state"] as string
        const old = sessions.get(id)
        if (old !== undefined) leave(old)
        if (isFleetState(state))
          enter({
            id,
            state,
            hostId: (r["hostId"] as string | null) ?? null,
            parkedAt: numOrNull(r["parkedAt"]),
            queuedAt: numOrNull(r["queuedAt"]),
            memMib: num(r["memMib"]),
            vcpus: num(r["vcpus"]),
          })
      }
      sessionsSince = d.xmin
    }
    return hosts.size === d.hostCount && (d.sessions === undefined || sessions.size === d.sessions.count)
  }

  const fetch = (withSessions: boolean) =>
    Effect.map(pool.query(deltaSql(hostsSince, withSessions ? sessionsSince : undefined, placer !== undefined)), ([row]): Delta => ({
      xmin: String(row?.["xmin"]),
      ...(placer === undefined ? {} : { placers: json<string[]>(row?.["placers"] ?? []) }),
      hostCount: num(row?.["hostCount"]),
      hosts: json<Record<string, unknown>[]>(row?.["hosts"] ?? []),
      ...(withSessions
        ? { sessions: { count: num(row?.["sessionCount"]), rows: json<Record<string, unknown>[]>(row?.["sessions"] ?? []) } }
        : {}),
    }))

  /** One read: what changed since the last, or everything when a row went away (or nothing is known yet). */
  const readOnce = (withSessions: boolean): Effect.Effect<void, Unavailable> =>
    Effect.gen(function* () {
      const gen = generation
      const startedAt = performance.now()
      const wasWhole = hostsSince === null && (!withSessions || sessionsSince === null)
      const d = yield* fetch(withSessions)
      if (gen !== generation) return
      if (take(d)) {
        knownAt = startedAt
        if (withSessions && wasWhole) full++
        else if (withSessions) delta++
        return
      }
      // A row went away: read everything again.
      clear()
      const whole = yield* fetch(withSessions)
      if (gen !== generation) return
      take(whole)
      knownAt = startedAt
      if (withSessions) full++
    })

  // The shared read of hosts: callers arriving while one runs wait for the next, which starts
  // after them (a batch of Effect's request batching, run when the reader is free); a caller
  // content with an older read joins the one in flight.
  interface ReadHosts extends Request.Request<void, Unavailable> {
    readonly since: number
  }
  const ReadHosts = Request.of<ReadHosts>()
  let inFlight: { readonly startedAt: number; readonly done: Deferred.Deferred<void, Unavailable> } | null = null
  const resolver = RequestResolver.makeWith<ReadHosts>({
    batchKey: () => "hosts",
    delay: Effect.andThen(Effect.yieldNow, reader.withPermits(1)(Effect.void)),
    collectWhile: () => true,
    runAll: (entries) =>
      reader.withPermits(1)(
        Effect.suspend(() => {
          const current = { startedAt: performance.now(), done: Deferred.makeUnsafe<void, Unavailable>() }
          inFlight = current
          return Effect.exit(readOnce(false)).pipe(
            Effect.map((exit) => {
              Deferred.doneUnsafe(current.done, exit)
              for (const e of entries) e.completeUnsafe(exit)
            }),
            // Whatever ends the read (an interruption too), those who joined it are answered.
            Effect.ensuring(
              Effect.sync(() => {
                if (inFlight === current) inFlight = null
                Deferred.doneUnsafe(current.done, Exit.interrupt())
              }),
            ),
          )
        }),
      ),
  })

  const view = (readAt: number): FleetRead => {
    sortedHosts ??= [...hosts.values()].sort((a, b) => Order.compareIds(a.row.id, b.row.id))
    const fleetHosts = sortedHosts.map((h) => {
      if (h.fleet === null) {
        h.parkList ??= [...h.parks.values()].sort((a, b) => a.parkedAt - b.parkedAt || Order.compareIds(a.sessionId, b.sessionId))
        h.fleet = { ...h.candidate, descentsRunning: h.descents.size, parks: h.parkList }
      }
      return h.fleet
    })
    queue ??= [...sessions.values()]
      .filter((s) => s.state === "queued")
      .sort((a, b) => (a.queuedAt ?? 0) - (b.queuedAt ?? 0) || Order.compareIds(a.id, b.id))
      .map((s) => ({ sessionId: s.id, budget: { memMib: s.memMib, vcpus: s.vcpus }, queuedAt: s.queuedAt ?? 0 }))
    return { hosts: fleetHosts, queue, readAt }
  }

  return {
    get: (id) => hosts.get(id),
    candidates: () => Array.from(hosts.values(), (e) => e.candidate),
    plan: (waiting, claimed = noClaims, now) => {
      // Claimed hosts leave the index for the walk: none of these is their holder.
      for (const id of claimed.keys()) index.remove(id)
      const walk = QueueWalk.walkOn(index, waiting, { spread, now })
      // The walk took each placement's room out of the index: put the known rows back.
      for (const id of [...claimed.keys(), ...walk.placed.map((p) => p.hostId)]) {
        const e = hosts.get(id)
        if (e !== undefined) index.upsert(e.candidate)
      }
      return walk
    },
    claims: (t, limitMs) =>
      Effect.suspend(() => {
        if (quietFrom <= t && t < quietUntil) return Effect.succeed(noClaims)
        const gen = generation
        const cutoff = t - limitMs
        return Effect.map(pool.query(starvingSql(cutoff)), (rows) => {
          const starving: ClaimHolder[] = []
          let next: number | null = null
          for (const r of rows) {
            const queuedAt = num(r["queuedAt"])
            if (queuedAt > cutoff) next = queuedAt
            else starving.push({ id: String(r["id"]), budget: { memMib: num(r["memMib"]), vcpus: num(r["vcpus"]) }, queuedAt })
          }
          if (gen !== generation) return noClaims
          if (starving.length > 0) {
            quietUntil = Number.NEGATIVE_INFINITY
            return QueueWalk.claims(index, starving, { now: t, limitMs }, limits)
          }
          // A session queued after this read queues at t or later (the Clock of another replica
          // may lag a little: its session is judged starving that much later).
          quietFrom = t
          quietUntil = Math.min(next ?? t, t) + limitMs
          return noClaims
        })
      }),
    anyFits: (budget, now) => index.anyFits(budget, now),
    tooBig: (budget) => (tooBigIndex ??= Placement.tooBigFor(Array.from(hosts.values(), (e) => e.candidate), limits))(budget),
    learn,
    forget,
    isRecent: () => maxReadAgeMs > 0 && performance.now() - knownAt <= maxReadAgeMs,
    refresh: (since) =>
      Effect.suspend(() => {
        const current = inFlight
        if (current !== null && current.startedAt >= since) return Deferred.await(current.done)
        return Effect.request(ReadHosts({ since }), resolver)
      }),
    fleet: (readAt) => reader.withPermits(1)(Effect.map(readOnce(true), () => view(readAt))),
    reset: (next) => {
      limits = next
      generation++
      clear()
    },
    stats: () => ({ full, delta }),
    checked: (p, c) => {
      placed += p
      conflicts += c
      if (p + c > 0) statements++
    },
    checks: () => ({ placed, conflicts, statements }),
    spread: () => spread,
  }
}
