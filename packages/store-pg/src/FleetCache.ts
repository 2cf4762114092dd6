/**
 * The incremental fleet read: the fleet view (hosts with their sums, parks and descents, and
 * the queue) kept in memory and brought up to date by reading only the rows that changed
 * since the last read, instead of aggregating every host and session each time.
 *
 * What changed is told by PostgreSQL itself, with nothing added to the write path: every row
 * version carries the id of the transaction that wrote it (`xmin`). A read runs as one
 * statement (one snapshot) and remembers that snapshot's `xmin` (every transaction below it
 * had ended); the next read asks for the rows written by transactions at or above it
 * (`age(xmin) <= age(previous)`), which covers every transaction that was still running or
 * not yet begun then, on any replica. Rows removed (a host removed, a reset) are caught by
 * counting: when the counts of hosts and of fleet sessions differ from what the view holds
 * after the delta, the view is read whole again. The cache decides nothing: the candidates
 * are `Room.toCandidate`'s (core's headroom), and the readers (the gate, the snapshot) are
 * core's.
 */
import type { FleetHost, Limits, Park, Queued } from "@engram/core"
import type { FleetRead, Unavailable } from "@engram/store"
import { sql } from "drizzle-orm"
import type { SQL } from "drizzle-orm"
import { Effect, Semaphore } from "effect"
import { query } from "./Db.js"
import type { Exec } from "./Db.js"
import { roomColumns, toCandidate, toRoomRow } from "./Room.js"
import type { RoomRow } from "./Room.js"

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

interface HostEntry {
  row: RoomRow
  readonly parks: Map<string, Park>
  readonly descents: Set<string>
  /** The host as the fleet read carries it; null once anything it shows changed. */
  fleet: FleetHost | null
}

interface Delta {
  readonly xmin: string
  readonly hostCount: number
  readonly sessionCount: number
  readonly hosts: Record<string, unknown>[]
  readonly sessions: Record<string, unknown>[]
}

const num = (v: unknown): number => (typeof v === "number" ? v : Number(v))
const numOrNull = (v: unknown): number | null => (v === null || v === undefined ? null : num(v))
const parse = <T>(v: unknown): T => (typeof v === "string" ? (JSON.parse(v) as T) : (v as T))

/**
 * The statement: the snapshot's xmin, the counts, and the hosts and sessions written since
 * `since` (a 64-bit transaction id as text), or every host and fleet session when `since` is null.
 */
export const deltaSql = (since: string | null): SQL => {
  // Row xmin is a 32-bit xid: compare by age (the distance back from now), wraparound-safe.
  const newer = since === null ? sql`true` : sql`age(xmin) <= age(${String(BigInt(since) % 4294967296n)}::xid)`
  const sessionFilter = since === null ? sql`state in ('parked', 'descending', 'queued')` : newer
  // One pass over the sessions gives both their count and the changed ones.
  return sql`select
    pg_snapshot_xmin(pg_current_snapshot())::text as xmin,
    (select count(*)::int from hosts) as "hostCount",
    s.n as "sessionCount",
    (select coalesce(json_agg(x), '[]'::json) from (
      select ${roomColumns("h", "room")}, 0 as "parks", 0 as "descents", null::json as "parkList" from hosts h where ${newer}
    ) x) as hosts,
    s.list as sessions
    from (
      select (count(*) filter (where state in ('parked', 'descending', 'queued')))::int as n,
        coalesce(json_agg(json_build_object('id', id, 'state', state, 'hostId', host_id, 'parkedAt', parked_at,
          'queuedAt', queued_at, 'memMib', mem_mib, 'vcpus', vcpus)) filter (where ${sessionFilter}), '[]'::json) as list
      from sessions
    ) s`
}

const byId = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0)

/** The fleet view kept up to date by deltas. */
export interface FleetCache {
  /** The fleet now: a delta read (or a whole read the first time, or after a removal). */
  readonly read: (readAt: number) => Effect.Effect<FleetRead, Unavailable>
  /** Forgets everything (a reset of the store): the next read is whole. */
  readonly reset: () => void
  /** What the last reads cost: whole reads and delta reads so far (for tests and the bench). */
  readonly stats: () => { readonly full: number; readonly delta: number }
}

/** A fleet cache over single-statement reads. */
export const make = (options: {
  readonly limits: () => Limits.Limits
  readonly read: <A>(body: (exec: Exec) => Promise<A>) => Effect.Effect<A, Unavailable>
}): FleetCache => {
  let since: string | null = null
  let hosts = new Map<string, HostEntry>()
  let sessions = new Map<string, SessionLite>()
  let sortedHosts: HostEntry[] | null = null
  let queue: Queued[] | null = null
  let full = 0
  let delta = 0
  const lock = Semaphore.makeUnsafe(1)

  const clear = (): void => {
    since = null
    hosts = new Map()
    sessions = new Map()
    sortedHosts = null
    queue = null
  }

  const leave = (s: SessionLite): void => {
    sessions.delete(s.id)
    if (s.state === "queued") queue = null
    const h = s.hostId === null ? undefined : hosts.get(s.hostId)
    if (h === undefined) return
    if (s.state === "parked" && h.parks.delete(s.id)) h.fleet = null
    if (s.state === "descending" && h.descents.delete(s.id)) h.fleet = null
  }
  const enter = (s: SessionLite): void => {
    sessions.set(s.id, s)
    if (s.state === "queued") queue = null
    const h = s.hostId === null ? undefined : hosts.get(s.hostId)
    if (h === undefined) return
    if (s.state === "parked") {
      h.parks.set(s.id, { sessionId: s.id, parkedAt: s.parkedAt ?? 0, budget: { memMib: s.memMib, vcpus: s.vcpus } })
      h.fleet = null
    } else if (s.state === "descending") {
      h.descents.add(s.id)
      h.fleet = null
    }
  }

  /** Applies a delta; false when the counts say a row went away (the view must be read whole). */
  const apply = (d: Delta): boolean => {
    for (const r of d.hosts) {
      const row = toRoomRow(r)
      const h = hosts.get(row.id)
      if (h === undefined) {
        hosts.set(row.id, { row, parks: new Map(), descents: new Set(), fleet: null })
        sortedHosts = null
      } else {
        h.row = row
        h.fleet = null
      }
    }
    for (const r of d.sessions) {
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
    since = d.xmin
    return hosts.size === d.hostCount && sessions.size === d.sessionCount
  }

  const fetch = (from: string | null) =>
    options.read(async (exec) => {
      const [row] = await query<Record<string, unknown>>(exec, deltaSql(from))
      return {
        xmin: String(row?.["xmin"]),
        hostCount: num(row?.["hostCount"]),
        sessionCount: num(row?.["sessionCount"]),
        hosts: parse<Record<string, unknown>[]>(row?.["hosts"] ?? []),
        sessions: parse<Record<string, unknown>[]>(row?.["sessions"] ?? []),
      } satisfies Delta
    })

  const view = (readAt: number): FleetRead => {
    const limits = options.limits()
    sortedHosts ??= [...hosts.values()].sort((a, b) => byId(a.row.id, b.row.id))
    const fleetHosts = sortedHosts.map((h) => {
      if (h.fleet === null) {
        const parks = [...h.parks.values()].sort((a, b) => a.parkedAt - b.parkedAt || byId(a.sessionId, b.sessionId))
        h.fleet = { ...toCandidate(h.row, limits), descentsRunning: h.descents.size, parks }
      }
      return h.fleet
    })
    queue ??= [...sessions.values()]
      .filter((s) => s.state === "queued")
      .sort((a, b) => (a.queuedAt ?? 0) - (b.queuedAt ?? 0) || byId(a.id, b.id))
      .map((s) => ({ sessionId: s.id, budget: { memMib: s.memMib, vcpus: s.vcpus }, queuedAt: s.queuedAt ?? 0 }))
    return { hosts: fleetHosts, queue, readAt }
  }

  const read = (readAt: number): Effect.Effect<FleetRead, Unavailable> =>
    lock.withPermits(1)(
      Effect.gen(function* () {
        if (since !== null) {
          const d = yield* fetch(since)
          delta++
          if (apply(d)) return view(readAt)
        }
        // First read, or a row went away: read whole.
        const d = yield* fetch(null)
        full++
        clear()
        apply(d)
        return view(readAt)
      }),
    )

  return { read, reset: clear, stats: () => ({ full, delta }) }
}
