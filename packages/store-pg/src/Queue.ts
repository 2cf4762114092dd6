/**
 * The queue (SPEC §2): listed first in first out, and drained by core's queue walk. A drain
 * locks the queued rows it decides on (a concurrent drain takes the others), walks them with
 * `QueueWalk.walk` over the host cache, locks the planned hosts in id order, replays the walk
 * against their fresh figures (`QueueWalk.replay`), and applies core's `place` plans as one
 * group. The walk honours core's holds for starving sessions (`QueueWalk.claims`): only a
 * claim's holder places on its host (creates and cold resumes skip it too: `Sessions.ts`), and
 * a drain that skipped a starving session another drain holds locked leaves that session's
 * claimed host alone (the claims over the whole queue: the host cache's `claims`). A
 * placement the walk made but core refused or the apply left out is reported, never dropped.
 */
import { randomUUID } from "node:crypto"
import { Plan, QueueWalk, Session } from "@engram/core"
import { Cursor } from "@engram/store"
import type { DrainResult, StoreShape } from "@engram/store"
import { and, asc, eq, sql } from "drizzle-orm"
import { Effect } from "effect"
import { apply } from "./Apply.js"
import { dieOnUnique } from "./Db.js"
import type { Conn } from "./Db.js"
import type { Deps } from "./Deps.js"
import type { Claimed } from "./HostCache.js"
import { lockAndReplay } from "./Locks.js"
import * as Pages from "./Pages.js"
import { toSession } from "./Rows.js"
import { sessions } from "./schema.js"
import { queuePosition, standingOf } from "./Sessions.js"

type QueueOps = Pick<StoreShape, "pageQueue" | "drainQueue">

/** The hosts of `claimed` whose holder is not among `own` (the rows this drain locked). */
const idsHeldElsewhere = (claimed: Claimed, own: ReadonlySet<string>): Set<string> => {
  const out = new Set<string>()
  for (const [hostId, holder] of claimed) if (!own.has(holder.id)) out.add(hostId)
  return out
}

const countQueued = <E>(conn: Conn<E>) =>
  Effect.map(conn.query<{ n: number }>(sql`select count(*)::int as n from sessions where state = 'queued'`), (rows) => Number(rows[0]?.n ?? 0))

/** The queue operations of the store. */
export const make = ({ db, now, limits, cache, park }: Deps): QueueOps => ({
  pageQueue: (page) =>
    Effect.gen(function* () {
      const { after, limit } = yield* Pages.check("queue", page)
      yield* cache.refresh(performance.now())
      const rows = yield* db.pool.use((exec) =>
        exec
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
      )
      const first = rows[0]
      const start = first === undefined ? 1 : yield* queuePosition(db.pool, toSession(first))
      const hosts = cache.candidates()
      const t = yield* now
      const entries = rows.map((r, i) => {
        const session = toSession(r)
        return { session, standing: standingOf(session, hosts, start + i, limits(), t) }
      })
      return Cursor.pageOf("queue", entries, (e) => [e.session.queuedAt as number, e.session.id], limit)
    }).pipe(dieOnUnique),

  drainQueue: (options = {}) =>
    Effect.gen(function* () {
      const t = yield* now
      const limit = options.limit ?? Number.POSITIVE_INFINITY
      yield* cache.refresh(performance.now())
      // The hosts claimed for starving sessions over the whole queue: read before the
      // transaction (on PGlite the pool and a transaction share one connection).
      const claimsNow = yield* cache.claims(t, park.options.starvationLimitMs)
      let runs = 0
      return yield* db.transaction((tx) =>
        Effect.gen(function* () {
          runs++
          if (!(limit > 0)) return { placed: [], unapplied: [], remaining: yield* countQueued(tx) } satisfies DrainResult
          // The queued rows this drain decides on, locked; a concurrent drain takes the others.
          const queued = yield* tx.use((exec) =>
            exec
              .select()
              .from(sessions)
              .where(eq(sessions.state, "queued"))
              .orderBy(asc(sessions.queuedAt), asc(sessions.id))
              .for("update", { skipLocked: true }),
          )
          // Hosts claimed for starving sessions another drain holds locked (this one skipped
          // them): nobody in this walk places there. Its own starving sessions claim in the walk.
          const own = new Set(queued.map((r) => r.id))
          const claimedElsewhere = queued.length === 0 ? new Set<string>() : idsHeldElsewhere(claimsNow, own)
          const hosts = claimedElsewhere.size === 0 ? cache.candidates() : cache.candidates().filter((h) => !claimedElsewhere.has(h.id))
          const walk = queued.length === 0 ? { placed: [] } : QueueWalk.walk(queued.map(toSession), hosts, { limit, starvation: { now: t, limitMs: park.options.starvationLimitMs }, now: t }, limits())
          if (walk.placed.length === 0) return { placed: [], unapplied: [], remaining: yield* countQueued(tx) } satisfies DrainResult
          const { accepted, versionOf } = yield* lockAndReplay(tx, walk.placed, limits(), runs)
          // What the walk placed but fresh room no longer takes stays queued, and is reported.
          const unapplied: { sessionId: string; reason: "refused" | "stale" }[] = walk.placed
            .filter((p) => !accepted.includes(p))
            .map((p) => ({ sessionId: p.waiting.id, reason: "stale" }))
          const plans: Plan.Plan[] = []
          for (const p of accepted) {
            const placement = { hostId: p.hostId, version: versionOf.get(p.hostId) as number, reservationId: randomUUID() }
            const answer = Session.step(p.waiting, { _tag: "place", placement }, t)
            if (answer._tag === "Plan") plans.push(answer)
            else unapplied.push({ sessionId: p.waiting.id, reason: "refused" })
          }
          const outcomes = yield* apply(tx, cache, plans)
          const placed: { sessionId: string; hostId: string }[] = []
          plans.forEach((plan, k) => {
            const s = Plan.sessionOf(plan) as Session.Record
            if (outcomes[k]?._tag === "Applied") placed.push({ sessionId: s.id, hostId: s.hostId as string })
            else unapplied.push({ sessionId: s.id, reason: "stale" })
          })
          return { placed, unapplied, remaining: yield* countQueued(tx) } satisfies DrainResult
        }),
      )
    }).pipe(dieOnUnique),
})
