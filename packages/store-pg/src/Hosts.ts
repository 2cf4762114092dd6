/** Hosts: registration, reports, states, the host views, and the one fleet read (SPEC §1, §4.1). */
import { Ledger as LedgerRules } from "@engram/core"
import { Conflict, Cursor, NotFound, Refused, Validate } from "@engram/store"
import type { InvalidInput } from "@engram/store"
import type { Host, HostView, StoreShape } from "@engram/store"
import { eq, sql } from "drizzle-orm"
import { Effect } from "effect"
import { query } from "./Db.js"
import type { Exec } from "./Db.js"
import type { Deps } from "./Deps.js"
import * as FleetCache from "./FleetCache.js"
import * as Pages from "./Pages.js"
import { readRoom, toHostView } from "./Room.js"
import { hosts, sessions } from "./schema.js"
import { err, ok } from "./Transaction.js"

type HostOps = Pick<
  StoreShape,
  | "registerHost"
  | "reportHost"
  | "setHostState"
  | "getHost"
  | "hostTokenHash"
  | "hostByTokenHash"
  | "setHostTokenHash"
  | "removeHost"
  | "listHosts"
  | "pageHosts"
  | "fleetView"
>

const hostNotFound = (id: string) => new NotFound({ entity: "host", id })

const hostOf = (h: typeof hosts.$inferSelect): Host => ({
  id: h.id,
  labels: { ...h.labels },
  state: h.state,
  report: h.reportedAt === null ? null : { totalMib: h.totalMib, allocatableMib: h.allocatableMib, totalVcpus: h.totalVcpus },
  reportedAt: h.reportedAt,
  createdAt: h.createdAt,
})

/** The host operations of the store. */
export const make = ({ op, read, now, limits, cache }: Deps): HostOps => {
  const fleet = FleetCache.make({ limits, read })
  const hostView = async (exec: Exec, id: string): Promise<HostView | undefined> => {
    const row = (await readRoom(exec, { hostIds: [id], sessions: "counts" }))[0]
    return row === undefined ? undefined : toHostView(row, limits())
  }

  return {
    registerHost: (input) =>
      Effect.gen(function* () {
        const bad = Validate.hostInput(input)
        if (bad) return yield* bad
        const t = yield* now
        const labels = { ...(input.labels ?? {}) }
        cache.stale()
        const inserted = yield* read((exec) =>
          exec
            .insert(hosts)
            .values({ id: input.id, labels, state: "ready", tokenHash: input.tokenHash ?? null, createdAt: t })
            .onConflictDoNothing()
            .returning({ id: hosts.id }),
        )
        cache.stale()
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
        const updated = await tx
          .update(hosts)
          .set({ state, version: sql`${hosts.version} + 1` })
          .where(eq(hosts.id, id))
          .returning({ id: hosts.id })
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
        (rows): Host | null => (rows[0] === undefined ? null : hostOf(rows[0])),
      ),

    setHostTokenHash: (id, tokenHash) =>
      Effect.flatMap(
        read((exec) => exec.update(hosts).set({ tokenHash }).where(eq(hosts.id, id)).returning()),
        (rows) => (rows[0] === undefined ? Effect.fail(hostNotFound(id)) : Effect.succeed(hostOf(rows[0]))),
      ),

    removeHost: (id) =>
      Effect.gen(function* () {
        const removed = yield* op<Host, NotFound | Refused>(async (tx) => {
          // The host's row lock first: placements onto it (which take a weaker lock on it) wait,
          // then see it gone.
          const [h] = await tx.select().from(hosts).where(eq(hosts.id, id)).for("update")
          if (h === undefined) return err(hostNotFound(id))
          const [onHost] = await query<{ n: number }>(tx, sql`select count(*)::int as n from ${sessions} where ${sessions.hostId} = ${id}`)
          const refused = LedgerRules.refuseHostRemoval(id, { entries: h.entries, sessions: Number(onHost?.n ?? 0) })
          if (refused) return err(new Refused({ check: refused.check, reason: refused.message }))
          await tx.delete(hosts).where(eq(hosts.id, id))
          return ok(hostOf(h))
        })
        cache.forget(id)
        return removed
      }),

    listHosts: () =>
      Effect.map(
        read((exec) => readRoom(exec, { sessions: "counts" })),
        (rows) => rows.map((r) => toHostView(r, limits())),
      ),

    pageHosts: (page) =>
      Effect.gen(function* () {
        const { after, limit } = yield* Pages.check("hosts", page)
        const rows = yield* read((exec) => readRoom(exec, { sessions: "counts", afterId: after?.[0], limit: limit + 1 }))
        return Cursor.pageOf("hosts", rows.map((r) => toHostView(r, limits())), (h) => [h.id], limit)
      }),

    // Incremental (FleetCache): only the rows written since the last read are read.
    fleetView: () => Effect.flatMap(now, (readAt) => fleet.read(readAt)),
  }
}
