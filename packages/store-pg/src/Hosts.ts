/**
 * Hosts: registration, reports, states, the host views, and the fleet view (SPEC §1, §4.1). A
 * write of a host's row answers the row, which the host cache learns once committed; the fleet
 * view is the host cache's (`HostCache.fleet`: only what changed since its last read is read).
 */
import { Ledger } from "@engram/core"
import { Conflict, CurrentFence, Cursor, NotFound, Refused, reportChanges, reportedTemplates, reportIsOutdated, reportReorderMs, reportReorderSlackMs, tokenHashTaken, unchangedByReport, Validate } from "@engram/store"
import type { Fence, Host, HostReport, HostView, InvalidInput, ReportChanges, ReportedHost, StoreShape } from "@engram/store"
import { eq, sql } from "drizzle-orm"
import { Effect } from "effect"
import * as Batcher from "./Batcher.js"
import { maxGroupedReads } from "./Assignments.js"
import { anyJson, dieOnUnique, UniqueViolation } from "./Db.js"
import * as FenceSql from "./Fence.js"
import type { Conn, DbError, Tx } from "./Db.js"
import type { Deps } from "./Deps.js"
import { hostColumns, json, readHostRows, reportOf, toHostRow, toHostView } from "./HostRows.js"
import type { HostRow } from "./HostRows.js"
import * as Pages from "./Pages.js"
import { beatBatching } from "./Reservations.js"
import type { BeatOptions } from "./Reservations.js"
import { hosts, hostVersionBump, sessions } from "./schema.js"

type HostOps = Pick<
  StoreShape,
  | "registerHost"
  | "reportHost"
  | "setHostState"
  | "getHost"
  | "hostByTokenHash"
  | "hostTokenHashes"
  | "setHostTokenHash"
  | "removeHost"
  | "pageHosts"
  | "fleetView"
>

const hostNotFound = (id: string) => new NotFound({ entity: "host", id })

/** The unique index on hosts' credential hashes (migration 0021): a host token authenticates one host. */
const tokenHashIndex = "hosts_token_hash_idx"

/** A write refused by the token hash index is `tokenHashTaken` for host `id`; any other unique violation is a defect. */
const tokenHashConflict =
  (id: string) =>
  <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, Exclude<E, UniqueViolation> | Conflict, R> =>
    Effect.catch(self, (e): Effect.Effect<never, Exclude<E, UniqueViolation> | Conflict> =>
      e instanceof UniqueViolation
        ? e.constraint === tokenHashIndex
          ? Effect.fail(tokenHashTaken(id))
          : Effect.die(e)
        : Effect.fail(e as Exclude<E, UniqueViolation>),
    )

const hostOf = (h: typeof hosts.$inferSelect): Host => ({
  id: h.id,
  labels: { ...h.labels },
  state: h.state,
  report: h.reportedAt === null ? null : { totalMib: h.totalMib, allocatableMib: h.allocatableMib, totalVcpus: h.totalVcpus, templates: h.templates },
  reportedAt: h.reportedAt,
  createdAt: h.createdAt,
  peerUrl: h.peerUrl,
})


/** A report to write at `t`. */
interface ReportItem extends HostReport {
  readonly id: string
  readonly t: number
}

/** The host operations of the store. */
export const make = ({ db, now, limits, cache }: Deps, options: BeatOptions = {}): HostOps => {
  const hostView = <E>(conn: Conn<E>, id: string) =>
    Effect.map(readHostRows(conn, { hostIds: [id], sessions: "counts" }), (rows) => (rows[0] === undefined ? undefined : toHostView(rows[0], limits())))

  /** Writes a host's row (its version bumped: a placement decided on the old one is stale) and answers its view. */
  const writeHost = (tx: Tx, id: string, set: SQLSet) =>
    Effect.gen(function* () {
      const [row] = yield* tx.query(sql`update hosts set ${set}, version = ${hostVersionBump("version")} where id = ${id} returning ${hostColumns("", "room")}, 0 as "parks", 0 as "descents"`)
      if (row === undefined) return undefined
      const written = toHostRow(row)
      tx.afterCommit(() => cache.learn(written))
      return yield* hostView(tx, id)
    })

  /** What a report changed on a host whose row was `before` (read locked, inside the write). */
  const changesOf = (before: HostRow, report: HostReport, t: number): ReportChanges =>
    reportChanges({ report: reportOf(before), peerUrl: before.peerUrl, reportedAt: before.reportedAt }, report, { now: t, limits: limits() })

  const reportAlone = (id: string, report: HostReport, t: number, fence: Fence | null) =>
    db.transaction((tx) =>
      Effect.gen(function* () {
        // Under a lease, behind its fence check (`Fence.run`: a stale epoch writes nothing).
        const [h] = yield* FenceSql.run(tx, fence, [sql`select ${hostColumns("h", "room")} from ${hosts} h where h.id = ${id} for no key update`])
        if (h === undefined) return yield* hostNotFound(id)
        const bad: InvalidInput | null = Validate.report(report)
        if (bad) return yield* bad
        // Older than the report the host holds: not written (`reportIsOutdated`).
        if (reportIsOutdated(toHostRow(h), t)) return { ...((yield* hostView(tx, id)) as HostView), ...unchangedByReport } satisfies ReportedHost
        const view = yield* writeHost(tx, id, sql`total_mib = ${report.totalMib}, allocatable_mib = ${report.allocatableMib}, total_vcpus = ${report.totalVcpus},
          templates = ${JSON.stringify(reportedTemplates(report))}::jsonb, peer_url = ${report.peerUrl ?? null}, reported_at = ${t}`)
        const reported: ReportedHost = { ...(view as HostView), ...changesOf(toHostRow(h), report, t) }
        return reported
      }),
    )

  /**
   * Writes reports of many hosts in one transaction: their rows locked in id order and read as
   * they were (`before`, the latest committed: a concurrent writer's report is waited for and
   * judged against), written by one statement (each version bumped), then their views read;
   * answers each report's view and what it changed, or undefined when its host is unknown.
   */
  const reportGroup = (items: readonly ReportItem[]) =>
    db.transaction((tx) =>
      Effect.gen(function* () {
        const written = yield* tx.query(sql`with report as (
            select * from jsonb_to_recordset(${JSON.stringify(items)}::jsonb)
              as r(id text, t bigint, "totalMib" float8, "allocatableMib" float8, "totalVcpus" bigint, templates jsonb, "peerUrl" text)),
          before as materialized (
            select ${hostColumns("h", "room")} from ${hosts} h where h.id = any(array(select id from report)) order by h.id for no key update)
          update ${hosts} h set total_mib = report."totalMib", allocatable_mib = report."allocatableMib", total_vcpus = report."totalVcpus",
            templates = report.templates, peer_url = report."peerUrl", reported_at = report.t, version = ${hostVersionBump("h.version")}
          from report join before on before.id = report.id
          where h.id = report.id and (before."reportedAt" is null or before."reportedAt" - report.t::float8 <= ${reportReorderSlackMs} or before."reportedAt" - report.t::float8 > ${reportReorderMs})
          returning ${hostColumns("h", "room")}, 0 as "parks", 0 as "descents", to_jsonb(before) as "before"`)
        const rows = written.map(toHostRow)
        const befores = new Map(written.map((r) => toHostRow(json<Record<string, unknown>>(r["before"]))).map((b) => [b.id, b]))
        tx.afterCommit(() => rows.forEach((r) => cache.learn(r)))
        // Every item's host: one whose report is older than the one it holds is not written
        // (`reportIsOutdated`) and answers its view, unchanged; an unknown one has none.
        const views = new Map((yield* readHostRows(tx, { hostIds: items.map((i) => i.id), sessions: "counts" })).map((r) => [r.id, toHostView(r, limits())]))
        return items.map((i): ReportedHost | undefined => {
          const view = views.get(i.id)
          if (view === undefined) return undefined
          const before = befores.get(i.id)
          return before === undefined ? { ...view, ...unchangedByReport } : { ...view, ...changesOf(before, i, i.t) }
        })
      }),
    )
  // Reports from many agents share a transaction (`BeatOptions`); two of one host go one after
  // the other. An unknown host fails its own caller alone; a failure of the database fails the
  // group's callers and writes nothing.
  const reports = Batcher.make<ReportItem, ReportedHost | undefined, DbError>({ ...beatBatching(options), name: "reports", keysOf: (i) => [i.id], run: reportGroup })

  // An agent's first request after a reconnect looks its host up by its token (the coordinator
  // keeps what it found): concurrent lookups share one statement (at most 256 hashes, two
  // statements at once), as the assignments reads do (`Assignments.ts`). At most one host holds
  // a hash (the index is unique). The group's hashes are probed in the token hash index
  // (`anyJson`), not joined against every host.
  const byTokenHash = Batcher.make<string, Host | null, DbError>({
    name: "hostByTokenHash",
    maxBatch: maxGroupedReads,
    maxInFlight: 2,
    keysOf: () => [],
    run: (hashes) =>
      Effect.map(
        db.pool.use((exec) =>
          hashes.length === 1
            ? exec.select().from(hosts).where(eq(hosts.tokenHash, hashes[0] as string)).orderBy(hosts.id).limit(1)
            : exec.select().from(hosts).where(anyJson(hosts.tokenHash, [...new Set(hashes)])).orderBy(hosts.id),
        ),
        (rows) => {
          const byHash = new Map<string, Host>()
          for (const r of rows) if (r.tokenHash !== null && !byHash.has(r.tokenHash)) byHash.set(r.tokenHash, hostOf(r))
          return hashes.map((h) => byHash.get(h) ?? null)
        },
      ),
  })

  return {
    registerHost: (input) =>
      Effect.gen(function* () {
        const bad = Validate.hostInput(input)
        if (bad) return yield* bad
        const t = yield* now
        const labels = { ...(input.labels ?? {}) }
        const inserted = yield* db.pool.query(sql`insert into hosts (id, labels, state, token_hash, created_at)
          values (${input.id}, ${JSON.stringify(labels)}::jsonb, 'ready', ${input.tokenHash ?? null}, ${t})
          on conflict (id) do nothing returning ${hostColumns("", "room")}, 0 as "parks", 0 as "descents"`)
        const row = inserted[0]
        if (row === undefined) return yield* new Conflict({ entity: "host", id: input.id, reason: "host already registered" })
        cache.learn(toHostRow(row))
        const host: Host = { id: input.id, labels, state: "ready", report: null, reportedAt: null, createdAt: t, peerUrl: null }
        return host
      }).pipe(tokenHashConflict(input.id)),

    reportHost: (id, report: HostReport) =>
      Effect.gen(function* () {
        const fence = yield* Effect.service(CurrentFence)
        const t = yield* now
        // A report that will be refused, or one made under a lease, is written alone.
        if (fence !== null || Validate.report(report) !== null) return yield* reportAlone(id, report, t, fence)
        const view = yield* reports({ id, t, totalMib: report.totalMib, allocatableMib: report.allocatableMib, totalVcpus: report.totalVcpus, templates: reportedTemplates(report), peerUrl: report.peerUrl ?? null })
        if (view === undefined) return yield* hostNotFound(id)
        return view
      }).pipe(dieOnUnique),

    setHostState: (id, state) =>
      db
        .transaction((tx) =>
          Effect.flatMap(writeHost(tx, id, sql`state = ${state}`), (view) => (view === undefined ? Effect.fail(hostNotFound(id)) : Effect.succeed(view))),
        )
        .pipe(dieOnUnique),

    getHost: (id) =>
      Effect.flatMap(hostView(db.pool, id), (v) => (v === undefined ? Effect.fail(hostNotFound(id)) : Effect.succeed(v))).pipe(dieOnUnique),

    hostByTokenHash: (tokenHash) => byTokenHash(tokenHash).pipe(dieOnUnique),

    // One statement whatever the number of ids (the coordinator's check of every open long-poll
    // after a possible miss asks 500 a call), as `getSessions`: the rows come by the primary key.
    hostTokenHashes: (ids) => {
      const unique = [...new Set(ids)]
      if (unique.length === 0) return Effect.succeed(new Map<string, string>())
      return Effect.map(
        db.pool.use((exec) =>
          exec
            .select({ id: hosts.id, tokenHash: hosts.tokenHash })
            .from(hosts)
            .where(sql`${anyJson(hosts.id, unique)} and ${hosts.tokenHash} is not null`),
        ),
        (rows): ReadonlyMap<string, string> => new Map(rows.flatMap((r) => (r.tokenHash === null ? [] : [[r.id, r.tokenHash] as const]))),
      ).pipe(dieOnUnique)
    },

    setHostTokenHash: (id, tokenHash) =>
      Effect.flatMap(
        db.pool.use((exec) => exec.update(hosts).set({ tokenHash }).where(eq(hosts.id, id)).returning()),
        (rows) => (rows[0] === undefined ? Effect.fail(hostNotFound(id)) : Effect.succeed(hostOf(rows[0]))),
      ).pipe(tokenHashConflict(id)),

    removeHost: (id) =>
      db
        .transaction((tx) =>
          Effect.gen(function* () {
            // The host's row lock first: placements onto it (which take a weaker lock on it) wait,
            // then see it gone.
            const [h] = yield* tx.use((exec) => exec.select().from(hosts).where(eq(hosts.id, id)).for("update"))
            if (h === undefined) return yield* hostNotFound(id)
            const [onHost] = yield* tx.query<{ n: number }>(sql`select count(*)::int as n from ${sessions} where ${sessions.hostId} = ${id}`)
            const refused = Ledger.refuseHostRemoval(id, { entries: h.entries, sessions: Number(onHost?.n ?? 0) })
            if (refused) return yield* new Refused({ check: refused.check, reason: refused.message })
            yield* tx.use((exec) => exec.delete(hosts).where(eq(hosts.id, id)))
            tx.afterCommit(() => cache.forget(id))
            return hostOf(h)
          }),
        )
        .pipe(dieOnUnique),

    pageHosts: (page) =>
      Effect.gen(function* () {
        const { after, limit } = yield* Pages.check("hosts", page)
        const rows = yield* readHostRows(db.pool, { sessions: "counts", afterId: after?.[0], limit: limit + 1 })
        return Cursor.pageOf("hosts", rows.map((r) => toHostView(r, limits())), (h) => [h.id], limit)
      }).pipe(dieOnUnique),

    fleetView: () => Effect.flatMap(now, (readAt) => cache.fleet(readAt)),
  }
}

type SQLSet = ReturnType<typeof sql>
