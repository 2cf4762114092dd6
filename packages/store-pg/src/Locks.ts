/**
 * The row locks of the store's transactions, and the locking host choice: core ranks, SQL
 * locks the best host no other transaction holds, core re-checks it under the lock. The one
 * lock order: sessions, then moves, then reservations, then hosts (several hosts in id order),
 * then host pairs (a commit takes its pair last, `Moves.ts`). A prune (`Prune.ts`) locks moves,
 * then sessions, then pairs, against that order: safe only because each of its locks is
 * `skip locked` and never waits.
 */
import { Placement, QueueWalk } from "@engram/core"
import type { Candidate, Limits } from "@engram/core"
import { and, eq, sql } from "drizzle-orm"
import type { SQL } from "drizzle-orm"
import { Effect } from "effect"
import { anyJson, RunAgain } from "./Db.js"
import type { Tx } from "./Db.js"
import { hostRowsSql, readHostRows, toCandidate, toHostRow } from "./HostRows.js"
import type { MoveRow, SessionRow } from "./Rows.js"
import { hosts, moves, sessions } from "./schema.js"

/** The session row, locked for this transaction. */
export const lockSession = (tx: Tx, id: string) =>
  Effect.map(
    tx.use((exec) => exec.select().from(sessions).where(eq(sessions.id, id)).for("update")),
    (rows): SessionRow | undefined => rows[0],
  )

/** The move row, locked for this transaction. */
export const lockMove = (tx: Tx, id: string) =>
  Effect.map(
    tx.use((exec) => exec.select().from(moves).where(eq(moves.id, id)).for("update")),
    (rows): MoveRow | undefined => rows[0],
  )

/** The session's open (pending) move, locked. */
export const lockOpenMove = (tx: Tx, sessionId: string) =>
  Effect.map(
    tx.use((exec) =>
      exec
        .select()
        .from(moves)
        .where(and(eq(moves.sessionId, sessionId), eq(moves.state, "pending")))
        .for("update"),
    ),
    (rows): MoveRow | undefined => rows[0],
  )

/**
 * Locks host rows in id order: the lock every transaction that adds a reservation to a host
 * holds, so two of them never judge the same room at once. `NO KEY UPDATE` (not `UPDATE`) so
 * that foreign-key checks of rows pointing at the host (`KEY SHARE`) do not wait on it.
 * Answers the ids locked (a host that does not exist is not).
 */
export const lockHosts = (tx: Tx, ids: readonly string[]) => {
  const sorted = [...new Set(ids)].sort()
  if (sorted.length === 0) return Effect.succeed([] as string[])
  return Effect.map(
    tx.use((exec) =>
      exec
        .select({ id: hosts.id })
        .from(hosts)
        .where(sorted.length === 1 ? eq(hosts.id, sorted[0] as string) : anyJson(hosts.id, sorted))
        .orderBy(hosts.id)
        .for("no key update"),
    ),
    (rows) => rows.map((r) => r.id),
  )
}

/**
 * One host's row locked (`NO KEY UPDATE`, as `lockHosts`, a report and the apply take it) and
 * its last report's time read by the locking statement: a report that holds the row is waited
 * for, and its time read (under READ COMMITTED a row locked after a concurrent update is read
 * as that update left it). Undefined: no such host.
 */
export const lockHostReported = (tx: Tx, id: string) =>
  Effect.map(
    tx.use((exec) => exec.select({ reportedAt: hosts.reportedAt }).from(hosts).where(eq(hosts.id, id)).for("no key update")),
    (rows): { readonly reportedAt: number | null } | undefined => rows[0],
  )

/** The outcome of a locking host choice. */
export type Picked =
  | { readonly _tag: "Chosen"; readonly hostId: string; readonly version: number }
  | { readonly _tag: "NoFit"; readonly hosts: readonly Candidate[] }

/**
 * Locks the best-ranked host of `rankedIds` that no other transaction holds, skipping held
 * ones, in one statement (the job-queue pattern: ORDER BY rank LIMIT 1 FOR … SKIP LOCKED).
 */
const lockFirstFreeSql = (rankedIds: readonly string[]): SQL =>
  sql`select h.id from hosts h
    join jsonb_array_elements_text(${JSON.stringify(rankedIds)}::jsonb) with ordinality as r(id, rank) on r.id = h.id
    order by r.rank
    limit 1
    for no key update of h skip locked`

/** How many of the best-ranked hosts one locking statement considers. */
const lockWindow = 8

/**
 * Set before a locking choice's first lock (in the same round trip), and rolled back to when the
 * host it locked fails its re-check: row locks taken inside a rolled-back subtransaction are
 * released. Never released on success: the writes that follow stay in the subtransaction that
 * took the lock, so updating the locked row stays a plain update (a row locked by one
 * subtransaction and updated by another gets a MultiXact).
 */
const pickSavepoint = sql.raw("savepoint engram_pick")
const undoPick = sql.raw("rollback to savepoint engram_pick")

/**
 * Chooses a host for the request (core's host choice) and leaves it locked, with the budget
 * fitting on it under the lock, at the version answered. The room of every host comes from the
 * host cache (`known`); core's `Placement.top` ranks the best few; one round trip locks the best
 * of them that no other placement holds and reads their rows again (after the lock); core's
 * `Placement.admits` and `Placement.fitsOn` re-check the locked host. A host that no longer fits
 * (a lost race) is released (`undoPick`, sent with the next round's statements) and goes back into
 * the pool with its fresh figures, and we choose again; when every host of the window is held we
 * wait for the best one. So the choice waits only while it holds no host: the hosts are locked in
 * rank order, not id order, and a rejected host kept locked while waiting for another closed a
 * circle with the transactions that lock hosts in id order (a deadlock the server broke after
 * `deadlock_timeout`). Where every transaction runs alone (`Tx.alone`, PGlite) no lock is ever
 * waited on, and no savepoint is set. Returns holding no host it rejected.
 */
export const pickAndLock = (tx: Tx, req: Placement.Request, limits: Limits.Limits, known: readonly Candidate[]) =>
  Effect.gen(function* () {
    const byId = new Map<string, Candidate>()
    for (const c of known) byId.set(c.id, c)
    const guarded = !tx.alone
    let saved = false
    // This call holds a host that failed its re-check (released by `undoPick`).
    let rejected = false
    for (let round = 0; round <= byId.size + 2; round++) {
      const window = Placement.top(byId.values(), req, lockWindow, limits)
      const best = window[0]
      if (best === undefined) break
      // Before the lock, in the same round trip: the savepoint (the first round), or the release
      // of the host the last round rejected.
      const before = !guarded ? [] : !saved ? [pickSavepoint] : rejected ? [undoPick] : []
      saved ||= guarded
      rejected = false
      // One round trip: lock the best host of the window no other transaction holds (a held
      // one is about to lose room, so concurrent placements spread over the next best instead
      // of queueing on one row lock), then read the window's sums. The server runs the two in
      // order and the read is a statement of its own, so its snapshot is taken once the lock
      // is held: fresh for the locked host.
      const answers = yield* tx.pipeline([
        ...before,
        window.length === 1 ? sql`select id from hosts where id = ${best} for no key update skip locked` : lockFirstFreeSql(window),
        hostRowsSql({ hostIds: window, columns: "room" }),
      ])
      const [lockedRows, windowRows] = answers.slice(before.length)
      let id = lockedRows?.[0]?.["id"] as string | undefined
      let freshRow = id === undefined ? undefined : windowRows?.find((r) => r["id"] === id)
      if (id === undefined) {
        // Every host of the window is held: wait for the best one (holding none this call
        // rejected: released above), then read it afresh.
        id = (yield* lockHosts(tx, [best]))[0]
        if (id === undefined) {
          byId.delete(best)
          continue
        }
        freshRow = (yield* tx.query(hostRowsSql({ hostIds: [id], columns: "room" })))[0]
      }
      rejected = true
      if (freshRow === undefined) {
        byId.delete(id)
        continue
      }
      const fresh = toHostRow(freshRow)
      const c = toCandidate(fresh, limits)
      byId.set(id, c)
      // Re-judged under the lock as `pick` judged it: the request admits it (a move's target that
      // stopped taking moves does not) and the budget fits.
      if (Placement.admits(c, req, limits) && Placement.fitsOn(c, req.budget, limits)) return { _tag: "Chosen", hostId: id, version: fresh.version } satisfies Picked
    }
    // Nothing fits: the host rejected last is released too (the caller may go on to queue).
    if (guarded && rejected) yield* tx.query(undoPick)
    return { _tag: "NoFit", hosts: [...byId.values()] } satisfies Picked
  })

/**
 * The hosts a walk decided on, locked in id order, and the walk replayed against their fresh
 * rows (`QueueWalk.replay`): the placements that still fit, in order, with each host's version
 * under the lock. Room changed between the walk's read and the locks: the transaction runs
 * again (at most twice; then what still fits is kept).
 */
export const lockAndReplay = <W extends QueueWalk.Waiting>(tx: Tx, placed: readonly QueueWalk.Planned<W>[], limits: Limits.Limits, run: number) =>
  Effect.gen(function* () {
    const hostIds = [...new Set(placed.map((p) => p.hostId))].sort()
    yield* lockHosts(tx, hostIds)
    const fresh = yield* readHostRows(tx, { hostIds, columns: "room" })
    const { accepted, diverged } = QueueWalk.replay(
      placed,
      fresh.map((r) => toCandidate(r, limits)),
      limits,
    )
    if (diverged && run < 3) return yield* new RunAgain({ why: "room changed before the hosts were locked" })
    return { accepted, versionOf: new Map(fresh.map((r) => [r.id, r.version])) }
  })
