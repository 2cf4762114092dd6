/**
 * What a store's connections wait on, read when its calls time out: its backends (found by the
 * pool's `application_name`) that wait, and for each lock wait the backend holding it
 * (`pg_blocking_pids`): its pid, application, user, client, state and since when, and its last
 * query (cut short, its string literals masked: a query's text may hold a secret).
 *
 * Why: a forgotten `BEGIN; LOCK TABLE …` in an operator's psql stalls every request on the
 * locked table until `statement_timeout`, and a timeout alone does not say it is a lock, nor
 * whose. The read runs on a connection of its own, opened for it and closed after: the pool's
 * may all be stuck behind the lock. It is bounded (`boundMs`, on the server and here) and
 * never fails: a database that does not answer it is itself the answer (`answered: false`).
 */
import postgres from "@engram/postgres"
import { Context, Effect } from "effect"
import { sessionAttrsFor } from "./SessionAttrs.js"

/** A backend of this store waiting on a lock, and one backend holding it. */
export interface LockWait {
  readonly waitingPid: number
  /** How long the waiting statement has run, ms. */
  readonly waitingMs: number
  readonly blockerPid: number
  readonly application: string
  readonly user: string
  /** The blocker's client address, or `local` (a Unix socket). */
  readonly client: string
  /** `idle in transaction`, `active`, … */
  readonly state: string
  /** How long the blocker has been in its state, ms. */
  readonly stateMs: number
  /** How long the blocker's transaction has been open, ms (null: none). */
  readonly transactionMs: number | null
  /** Its last statement, cut short, string literals masked. */
  readonly query: string
}

/** What the store's connections were doing when read. */
export type Diagnosis =
  | {
      readonly answered: true
      /** This store's backends running a statement now, and how many of them wait on a lock. */
      readonly active: number
      readonly waitingOnLock: number
      /** This store's active backends' wait events other than locks (`IO:DataFileRead` → count). */
      readonly otherWaits: Readonly<Record<string, number>>
      readonly lockWaits: readonly LockWait[]
    }
  | { readonly answered: false; readonly reason: string }

/** Reads what this store's connections wait on now. */
export class Blockers extends Context.Service<Blockers, { readonly diagnose: Effect.Effect<Diagnosis> }>()("@engram/store-pg/Blockers") {}

/** The `application_name` of the diagnosis's own connection (it is not one of the store's). */
export const diagnosisApplicationName = "engram-diagnosis"

/** The default bound of one diagnosis, ms: connecting and the query together. */
export const defaultBoundMs = 2_000

const queryChars = 160

/** A query's text for a log line: string literals and dollar-quoted bodies masked, whitespace folded, cut to `queryChars`. */
export const maskQuery = (text: string): string => {
  const masked = text
    .replace(/\$([A-Za-z_][A-Za-z_0-9]*)?\$[\s\S]*?\$\1\$/g, "$…$")
    // E'…' strings take backslash escapes (E'pa\'ss' is one string); the others only doubled
    // quotes. A prefix counts only as a word of its own: in like'a\' the quote opens a plain string.
    .replace(/(?<![A-Za-z0-9_$])[Ee]'(?:[^'\\]|\\[\s\S]|'')*'?|(?:(?<![A-Za-z0-9_$])(?:[BbXx]|[Uu]&))?'(?:[^']|'')*'?/g, "'…'")
    .replace(/\s+/g, " ")
    .trim()
  return masked.length > queryChars ? `${masked.slice(0, queryChars)}…` : masked
}

interface Row {
  readonly pid: number
  readonly waitEventType: string | null
  readonly waitEvent: string | null
  readonly state: string | null
  readonly runningMs: number | null
  readonly blockerPid: number | null
  readonly application: string | null
  readonly user: string | null
  readonly client: string | null
  readonly blockerState: string | null
  readonly stateMs: number | null
  readonly transactionMs: number | null
  readonly query: string | null
}

const rowsToDiagnosis = (rows: readonly Row[]): Diagnosis => {
  const activePids = new Set<number>()
  const lockPids = new Set<number>()
  const otherWaits: Record<string, number> = {}
  const lockWaits: LockWait[] = []
  // One row per (backend, blocker): a backend waiting on several holders comes several times.
  for (const r of rows) {
    if (r.state !== "active") continue
    if (!activePids.has(r.pid)) {
      activePids.add(r.pid)
      if (r.waitEventType === "Lock") lockPids.add(r.pid)
      else if (r.waitEventType !== null) {
        const event = `${r.waitEventType}:${r.waitEvent ?? "?"}`
        otherWaits[event] = (otherWaits[event] ?? 0) + 1
      }
    }
    if (r.waitEventType === "Lock" && r.blockerPid !== null) lockWaits.push(lockWait(r))
  }
  return { answered: true, active: activePids.size, waitingOnLock: lockPids.size, otherWaits, lockWaits }
}

const lockWait = (r: Row): LockWait => ({
  waitingPid: r.pid,
  waitingMs: Math.round(r.runningMs ?? 0),
  blockerPid: r.blockerPid ?? 0,
  application: r.application ?? "",
  user: r.user ?? "",
  client: r.client ?? "local",
  state: r.blockerState ?? "unknown",
  stateMs: Math.round(r.stateMs ?? 0),
  transactionMs: r.transactionMs === null ? null : Math.round(r.transactionMs),
  query: maskQuery(r.query ?? ""),
})

/**
 * The diagnosis of the store whose pool's connections are named `applicationName`, on a
 * connection of its own to `url`, within `boundMs`.
 */
export const make = (url: string, applicationName: string, boundMs = defaultBoundMs): Effect.Effect<Diagnosis> =>
  Effect.promise(async (): Promise<Diagnosis> => {
    const sql = postgres(url, {
      max: 1,
      connect_timeout: Math.max(1, Math.ceil(boundMs / 1000)),
      idle_timeout: 1,
      onnotice: () => undefined,
      ...sessionAttrsFor(url),
      connection: { application_name: diagnosisApplicationName, statement_timeout: boundMs, lock_timeout: boundMs },
    })
    let timer: NodeJS.Timeout | undefined
    try {
      const rows = await Promise.race([
        sql<Row[]>`
          select w.pid, w.wait_event_type as "waitEventType", w.wait_event as "waitEvent", w.state,
            extract(epoch from (clock_timestamp() - w.query_start)) * 1000 as "runningMs",
            b.pid as "blockerPid", b.application_name as application, b.usename::text as "user",
            host(b.client_addr) as client, b.state as "blockerState",
            extract(epoch from (clock_timestamp() - b.state_change)) * 1000 as "stateMs",
            extract(epoch from (clock_timestamp() - b.xact_start)) * 1000 as "transactionMs",
            b.query
          from pg_stat_activity w
          left join lateral unnest(pg_blocking_pids(w.pid)) as bp(pid) on true
          left join pg_stat_activity b on b.pid = bp.pid
          where w.application_name = ${applicationName} and w.datname = current_database()
          order by w.pid`.execute(),
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new Error(`no answer within ${boundMs} ms`)), boundMs)
        }),
      ])
      return rowsToDiagnosis(rows.map((r) => ({ ...r, runningMs: num(r.runningMs), stateMs: num(r.stateMs), transactionMs: num(r.transactionMs) })))
    } catch (e) {
      return { answered: false, reason: e instanceof Error ? e.message : String(e) }
    } finally {
      clearTimeout(timer)
      void sql.end({ timeout: 0 }).catch(() => undefined)
    }
  })

// postgres.js answers numeric as a string.
const num = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v))

const seconds = (ms: number): string => `${(ms / 1000).toFixed(1)} s`

/**
 * The diagnosis as a sentence for a log line: the lock and its holder ("… wait on a lock held by
 * pid N (application X, user U, client C, idle in transaction for 42.0 s, transaction open
 * 42.1 s, last query: …)"), or what the connections wait on otherwise.
 */
export const describe = (d: Diagnosis): string => {
  if (!d.answered) return `the database did not answer the diagnosis either (${d.reason}): it is unreachable from this replica or overloaded`
  const byBlocker = new Map<number, { readonly wait: LockWait; readonly waiting: Set<number> }>()
  for (const w of d.lockWaits) {
    const entry = byBlocker.get(w.blockerPid) ?? { wait: w, waiting: new Set<number>() }
    entry.waiting.add(w.waitingPid)
    byBlocker.set(w.blockerPid, entry)
  }
  const others = Object.entries(d.otherWaits)
    .map(([event, n]) => `${event} ×${n}`)
    .join(", ")
  if (byBlocker.size === 0)
    return `none of this replica's ${d.active} running statements waits on a lock${others === "" ? "" : ` (they wait on ${others})`}: the database is slow, not blocked`
  const holders = [...byBlocker.entries()].map(([pid, { wait: w, waiting }]) => {
    const app = w.application === "" ? "no application_name" : `application "${w.application}"`
    const tx = w.transactionMs === null ? "" : `, transaction open ${seconds(w.transactionMs)}`
    return `${waiting.size} wait on a lock held by pid ${pid} (${app}, user ${w.user}, client ${w.client}, ${w.state} for ${seconds(w.stateMs)}${tx}, last query: ${w.query}); its session ends it with COMMIT or ROLLBACK, an operator with select pg_terminate_backend(${pid})`
  })
  return `${d.waitingOnLock} of this replica's ${d.active} running statements wait on a lock: ${holders.join("; ")}`
}
