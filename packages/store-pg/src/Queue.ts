/**
 * The queue (SPEC §2): listed first in first out, and drained by core's queue walk. A drain
 * locks the queued rows it decides on (a concurrent drain takes the others), walks them with
 * `QueueWalk.walk` over one read of room, locks the planned hosts in id order, replays the
 * plan against their fresh figures (`QueueWalk.replay`), and writes core's `place` steps in
 * one statement whose compare-and-set (`queued → pending`) a lost race fails.
 */
import { randomUUID } from "node:crypto"
import { QueueWalk, Session as SessionRules } from "@engram/core"
import { Cursor } from "@engram/store"
import type { DrainResult, Page, QueueEntry, StoreShape } from "@engram/store"
import { and, asc, eq, sql } from "drizzle-orm"
import { Effect } from "effect"
import { query } from "./Db.js"
import type { Exec } from "./Db.js"
import type { Deps } from "./Deps.js"
import { lockHosts } from "./Locks.js"
import * as Pages from "./Pages.js"
import { readRoom, toCandidate } from "./Room.js"
import { toSession } from "./Rows.js"
import { sessions } from "./schema.js"
import { queuePosition, standingOf } from "./Sessions.js"
import { ok, retry } from "./Transaction.js"
import { bumpMetricSql, hostSumsSql, insertEvents } from "./Writes.js"

type QueueOps = Pick<StoreShape, "listQueue" | "pageQueue" | "drainQueue">

const countQueued = async (tx: Exec): Promise<number> =>
  Number((await query<{ n: number }>(tx, sql`select count(*)::int as n from sessions where state = 'queued'`))[0]?.n ?? 0)

/**
 * Writes core's `place` steps: each session `queued → pending` (a CAS) with its new
 * reservation, the sums, the metric and its history (the drain holds the queued rows' locks).
 */
const writePlacements = async (tx: Exec, placed: readonly SessionRules.Applied[]): Promise<void> => {
  const rows = JSON.stringify(
    placed.map(({ session: s, ledger }) => {
      const e = (ledger[0] as Extract<SessionRules.LedgerChange, { _tag: "Reserve" }>).entry
      return {
        sid: s.id,
        state: s.state,
        hid: s.hostId,
        rid: s.reservationId,
        qat: s.queuedAt,
        pat: s.parkedAt,
        uat: s.updatedAt,
        rkind: e.ownerKind,
        mem: e.memMib,
        vcpus: e.vcpus,
        rat: e.createdAt,
        rbeat: e.lastHeartbeatAt,
      }
    }),
  )
  await tx.execute(sql`with p as (
      select * from jsonb_to_recordset(${rows}::jsonb)
        as p(sid text, state text, hid text, rid text, qat bigint, pat bigint, uat bigint, rkind text, mem float8, vcpus float8,
          rat bigint, rbeat bigint)
    ), s as (
      update sessions set state = p.state, host_id = p.hid, reservation_id = p.rid, queued_at = p.qat, parked_at = p.pat, updated_at = p.uat
      from p where sessions.id = p.sid and sessions.state = 'queued'
      returning sessions.id
    ), r as (
      insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, created_at, last_heartbeat_at)
      select p.rid, p.hid, p.rkind, p.sid, p.mem, p.vcpus, p.rat, p.rbeat from p join s on s.id = p.sid
      returning host_id, mem_mib, vcpus
    ), h as (${hostSumsSql("+", sql`r`)}), m as (${bumpMetricSql("total_reserved_mib", sql`sum(mem_mib)`, sql`r`)})
    select count(*) from s`)
  await insertEvents(
    tx,
    placed.map((a) => ({ sessionId: a.session.id, at: a.session.updatedAt, events: a.events })),
  )
}

/** The queue operations of the store. */
export const make = ({ op, read, both, now, limits }: Deps): QueueOps => ({
  pageQueue: (page) =>
    Effect.gen(function* () {
      const { after, limit } = yield* Pages.check("queue", page)
      return yield* op<Page<QueueEntry>, never>(
        async (tx) => {
          const [rows, room] = await both(
            () =>
              tx
                .select()
                .from(sessions)
                .where(
                  and(
                    eq(sessions.state, "queued"),
                    after === undefined ? undefined : sql`(${sessions.queuedAt}, ${sessions.id}) > (${after[0]}, ${after[1]})`,
                  ),
                )
                .orderBy(asc(sessions.queuedAt), asc(sessions.id))
                .limit(limit + 1),
            () => readRoom(tx, { columns: "room" }),
          )
          const first = rows[0]
          const start = first === undefined ? 1 : await queuePosition(tx, toSession(first))
          const hosts = room.map((r) => toCandidate(r, limits()))
          const entries = rows.map((r, i) => {
            const session = toSession(r)
            return { session, standing: standingOf(session, hosts, start + i, limits()) }
          })
          return ok(Cursor.pageOf("queue", entries, (e) => [e.session.queuedAt as number, e.session.id], limit))
        },
        undefined,
        true,
      )
    }),

  listQueue: () =>
    Effect.map(
      read((exec) => exec.select().from(sessions).where(eq(sessions.state, "queued")).orderBy(asc(sessions.queuedAt), asc(sessions.id))),
      (rows) => rows.map(toSession),
    ),

  drainQueue: (options = {}) =>
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
        const walk = QueueWalk.walk(
          queued.map(toSession),
          rows.map((r) => toCandidate(r, limits())),
          { limit },
          limits(),
        )
        if (walk.placed.length === 0) return ok({ placed: [], remaining: await countQueued(tx) })
        // Lock every host of the plan in id order, then replay the plan against fresh sums.
        const hostIds = [...new Set(walk.placed.map((p) => p.hostId))].sort()
        await lockHosts(tx, hostIds)
        const fresh = (await readRoom(tx, { hostIds, columns: "room" })).map((r) => toCandidate(r, limits()))
        const { accepted, diverged } = QueueWalk.replay(walk.placed, fresh, limits())
        // Room changed between the read and the locks: plan again from fresh figures.
        if (diverged && attempt < 2) return retry
        const steps: SessionRules.Applied[] = []
        for (const p of accepted) {
          const answer = SessionRules.step(p.waiting, { _tag: "place", placement: { hostId: p.hostId, reservationId: randomUUID() } }, t)
          if (answer._tag === "Applied") steps.push(answer)
        }
        if (steps.length > 0) await writePlacements(tx, steps)
        return ok({
          placed: steps.map((a) => ({ sessionId: a.session.id, hostId: a.session.hostId as string })),
          remaining: await countQueued(tx),
        })
      })
    }),
})
