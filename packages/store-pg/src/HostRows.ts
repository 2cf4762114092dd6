/**
 * Host rows: the SQL that reads hosts with what the ledger holds on them, and what their rows
 * mean to the store's interface. The reserved sums and entry counts are the ones maintained on
 * each host row by the apply (`Apply.ts`, in the same statement as every ledger write);
 * `host_reserved_sums` (a view, the one computation of the sums from the ledger) backfilled
 * them and `sumsDriftSql` checks them. What the sums mean (room, fits, capacity) is decided by
 * `@engram/core`, never here.
 */
import { Headroom, Move } from "@engram/core"
import type { Budget, Candidate, Limits, Placement } from "@engram/core"
import type { Host, HostView } from "@engram/store"
import { sql } from "drizzle-orm"
import type { SQL } from "drizzle-orm"
import { Effect } from "effect"
import { anyJson } from "./Db.js"
import type { Conn } from "./Db.js"

/** A host with its reserved sums (and, when asked, the count of its parks and descents). */
export interface HostRow {
  readonly id: string
  readonly labels: Record<string, string>
  readonly state: Placement.HostState
  readonly totalMib: number | null
  readonly allocatableMib: number | null
  readonly totalVcpus: number | null
  /** The templates of the host's last report (placement prefers their holders). */
  readonly templates: readonly Placement.HeldTemplate[]
  /** Where the host's agent serves its peers (its last report's), or null. */
  readonly peerUrl: string | null
  readonly reportedAt: number | null
  readonly createdAt: number
  /** Bumped by every change of the sums, the report or the state (see schema.ts). */
  readonly version: number
  readonly reservedMemMib: number
  readonly reservedVcpus: number
  readonly entries: number
  readonly parks: number
  readonly descents: number
}

/** What to read beside the sums. */
export interface HostRowsOptions {
  /** Only these hosts (all when absent). */
  readonly hostIds?: readonly string[] | undefined
  /** `counts`: parks and descents per host (the host views). */
  readonly sessions?: "none" | "counts" | undefined
  /** `room`: only what placement reads (no labels): less to send and parse per placement. */
  readonly columns?: "room" | "full" | undefined
  /** A page: hosts with an id after this one (in id order)… */
  readonly afterId?: string | undefined
  /** …and at most this many. */
  readonly limit?: number | undefined
}

const idFilter = (column: SQL, ids: readonly string[] | undefined): SQL => {
  if (ids === undefined) return sql`true`
  if (ids.length === 1) return sql`${column} = ${ids[0]}`
  return anyJson(column, ids)
}

/**
 * The columns of a host row from a `hosts` row (aliased `h`, or a `RETURNING` list when
 * `alias` is empty): the same shape for reads and for the apply's answer.
 */
export const hostColumns = (alias: "h" | "hosts" | "", columns: HostRowsOptions["columns"] = "full"): SQL => {
  const c = (name: string) => sql.raw(alias === "" ? name : `${alias}.${name}`)
  return sql`${c("id")} as id, ${columns === "room" ? sql`null::jsonb` : c("labels")} as labels, ${c("state")} as state,
      ${c("total_mib")} as "totalMib", ${c("allocatable_mib")} as "allocatableMib", ${c("total_vcpus")} as "totalVcpus", ${c("templates")} as "templates", ${c("peer_url")} as "peerUrl",
      ${c("reported_at")}::float8 as "reportedAt", ${c("created_at")}::float8 as "createdAt", ${c("version")}::float8 as "version",
      ${c("reserved_mem_mib")}::float8 as "reservedMemMib", ${c("reserved_vcpus")}::float8 as "reservedVcpus", ${c("entries")} as "entries"`
}

/**
 * The statement: hosts with their maintained sums (and, when asked, left-joined with one
 * grouped pass over their parked and descending sessions), sorted by host id.
 */
export const hostRowsSql = (options: HostRowsOptions = {}): SQL => {
  const ids = options.hostIds
  const counts = (options.sessions ?? "none") === "counts"
  const sessionCols = counts
    ? sql`coalesce(s.parks, 0) as "parks", coalesce(s.descents, 0) as "descents"`
    : sql`0 as "parks", 0 as "descents"`
  const sessionJoin = counts
    ? sql`left join (
          select host_id,
            (count(*) filter (where state = 'parked'))::int as parks,
            (count(*) filter (where state = 'descending'))::int as descents
          from sessions
          where state in ('parked', 'descending') and ${idFilter(sql`host_id`, ids)}
          group by host_id
        ) s on s.host_id = h.id`
    : sql``
  return sql`
    select ${hostColumns("h", options.columns)},
      ${sessionCols}
    from hosts h
    ${sessionJoin}
    where ${idFilter(sql`h.id`, ids)} ${options.afterId === undefined ? sql`` : sql`and h.id > ${options.afterId}`}
    order by h.id
    ${options.limit === undefined ? sql`` : sql`limit ${options.limit}`}`
}

/**
 * The hosts whose maintained sums differ from the ledger (`host_reserved_sums`, the one
 * computation of the sums from the reservations): empty whenever the store is consistent.
 */
export const sumsDriftSql = (): SQL => sql`
  select h.id, h.reserved_mem_mib::float8 as "reservedMemMib", h.reserved_vcpus::float8 as "reservedVcpus", h.entries,
    coalesce(s.mem_mib, 0)::float8 as "ledgerMemMib", coalesce(s.vcpus, 0)::float8 as "ledgerVcpus", coalesce(s.entries, 0) as "ledgerEntries"
  from hosts h
  full join host_reserved_sums s on s.host_id = h.id
  where h.id is null
    or h.reserved_mem_mib <> coalesce(s.mem_mib, 0)
    or h.reserved_vcpus <> coalesce(s.vcpus, 0)
    or h.entries <> coalesce(s.entries, 0)
  order by h.id`

/** A host whose maintained sums differ from the ledger's. */
export interface SumsDrift {
  readonly id: string | null
  readonly reservedMemMib: number | null
  readonly reservedVcpus: number | null
  readonly entries: number | null
  readonly ledgerMemMib: number
  readonly ledgerVcpus: number
  readonly ledgerEntries: number
}

/** The hosts whose maintained sums drifted from the ledger (none when consistent). */
export const readSumsDrift = <E>(conn: Conn<E>) =>
  Effect.map(conn.query(sumsDriftSql()), (rows) => rows.map((r): SumsDrift => ({
    id: (r["id"] as string | null) ?? null,
    reservedMemMib: numOrNull(r["reservedMemMib"]),
    reservedVcpus: numOrNull(r["reservedVcpus"]),
    entries: numOrNull(r["entries"]),
    ledgerMemMib: num(r["ledgerMemMib"]),
    ledgerVcpus: num(r["ledgerVcpus"]),
    ledgerEntries: num(r["ledgerEntries"]),
  })))

/** A number from either driver (postgres.js answers bigints and numerics as text). */
export const num = (v: unknown): number => (typeof v === "number" ? v : Number(v))
/** A number, or null. */
export const numOrNull = (v: unknown): number | null => (v === null || v === undefined ? null : num(v))
/** A json value from either driver (postgres.js parses it, PGlite may answer text). */
export const json = <T>(v: unknown): T => (typeof v === "string" ? (JSON.parse(v) as T) : (v as T))

/** Normalizes a row from either driver (or from json_agg). */
export const toHostRow = (r: Record<string, unknown>): HostRow => ({
  id: r["id"] as string,
  labels: json<Record<string, string>>(r["labels"] ?? {}),
  state: r["state"] as Placement.HostState,
  totalMib: numOrNull(r["totalMib"]),
  allocatableMib: numOrNull(r["allocatableMib"]),
  totalVcpus: numOrNull(r["totalVcpus"]),
  templates: json<Placement.HeldTemplate[]>(r["templates"] ?? []),
  peerUrl: (r["peerUrl"] ?? null) as string | null,
  reportedAt: numOrNull(r["reportedAt"]),
  createdAt: num(r["createdAt"]),
  version: num(r["version"]),
  reservedMemMib: num(r["reservedMemMib"]),
  reservedVcpus: num(r["reservedVcpus"]),
  entries: num(r["entries"]),
  parks: num(r["parks"] ?? 0),
  descents: num(r["descents"] ?? 0),
})

/** Reads hosts with their reserved sums. */
export const readHostRows = <E>(conn: Conn<E>, options: HostRowsOptions = {}): Effect.Effect<HostRow[], E> =>
  options.hostIds !== undefined && options.hostIds.length === 0 ? Effect.succeed([]) : Effect.map(conn.query(hostRowsSql(options)), (rows) => rows.map(toHostRow))

/** The report of a host, null before its first report. */
export const reportOf = (row: HostRow): Host["report"] =>
  row.reportedAt === null ? null : { totalMib: row.totalMib, allocatableMib: row.allocatableMib, totalVcpus: row.totalVcpus, templates: row.templates }

/** Whether the host is measured (core's rule). */
export const measuredOf = (row: HostRow): boolean => {
  const report = reportOf(row)
  return report !== null && Headroom.isMeasuredReport(report)
}

/** The reserved budget of a row. */
export const reservedOf = (row: HostRow): Budget => ({ memMib: row.reservedMemMib, vcpus: row.reservedVcpus })

/** The host as placement sees it; headroom through `Headroom.fromReport`. */
export const toCandidate = (row: HostRow, limits: Limits.Limits): Candidate => ({
  id: row.id,
  headroom: Headroom.fromReport(
    { allocatableMib: row.allocatableMib, totalVcpus: row.totalVcpus },
    reservedOf(row),
    limits,
  ),
  state: row.state,
  entries: row.entries,
  measured: measuredOf(row),
  reported: row.reportedAt !== null,
  reportedAt: row.reportedAt,
  takesMoves: Move.takesMoves(row.peerUrl),
  // Only a host holding templates names them: most hosts' candidates stay as they were.
  ...(row.templates.length > 0 ? { templates: row.templates } : {}),
})

/** The host view of the store interface. */
export const toHostView = (row: HostRow, limits: Limits.Limits): HostView => {
  const c = toCandidate(row, limits)
  return {
    id: row.id,
    labels: row.labels,
    state: row.state,
    report: reportOf(row),
    reportedAt: row.reportedAt,
    createdAt: row.createdAt,
    peerUrl: row.peerUrl,
    measured: c.measured ?? false,
    headroom: c.headroom,
    entries: row.entries,
    parks: row.parks,
    descentsRunning: row.descents,
  }
}
