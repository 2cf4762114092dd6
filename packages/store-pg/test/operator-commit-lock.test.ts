// An operator's commit (`commitMoveByOperator`) judges the move's source under the source host's
// row lock, in the commit's transaction: a report of the source that holds that lock while the
// commit runs is waited for, never judged on the row as it was before the report. Two
// connections on a real PostgreSQL: a third party writes a report of the source (its row locked,
// its `reported_at` set, as the store's report does) and holds its transaction open; the commit
// runs meanwhile. It waits on the report's lock (seen in `pg_blocking_pids`), then, the report
// committed, is refused (the source is heard) with nothing changed; with the report rolled back
// instead, the source stays silent and the commit lands. A check of the source before the commit
// (what the coordinator did alone) would pass here and commit on the stale read.
import { Limits, Move } from "@engram/core"
import postgres from "@engram/postgres"
import { freshDatabase } from "@engram/test-pg"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { openUrl } from "./open.js"

const limits: Limits.Limits = { ...Limits.defaults, heartbeatStaleWindowMs: 60_000 }
const report = (id: string) => ({ totalMib: 1 << 16, allocatableMib: 1 << 15, totalVcpus: 16, peerUrl: `http://peers.test:7100/${id}` })
const intent = { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 } as const

describe("an operator's commit under the source host's row lock (PostgreSQL)", () => {
  it("waits for a report of the source that holds the row, and judges the source as the report left it", async () => {
    const db = await freshDatabase()
    const sql = postgres(db.url, { max: 4, onnotice: () => undefined })
    const { pair, close } = await openUrl(db.url, { limits, poolSize: 4 })
    const s = pair.store
    const run = <A, E>(e: Effect.Effect<A, E>) => Effect.runPromise(e)
    try {
      const commit = s.commitMoveByOperator
      if (commit === undefined) throw new Error("store-pg has no commitMoveByOperator")
      for (const id of ["src", "dst"]) {
        await run(s.registerHost({ id }))
        await run(s.reportHost(id, report(id)))
      }
      await run(s.createSession({ id: "s1", budget: { memMib: 256, vcpus: 1 }, affinity: ["src"] }))
      await run(s.markRunning("s1"))
      const move = await run(s.beginMove({ sessionId: "s1", targetHostId: "dst", maxDowntimeMs: 600 }))
      await run(s.recordRound(move.id, intent))
      /** The source silent: its last report ten minutes ago (the window is one). */
      const silence = () => sql`update hosts set reported_at = ${Date.now() - 10 * 60_000} where id = 'src'`
      /** A report of the source, its transaction held open: the row locked as the store's report locks it, `reported_at` now. */
      const reportHeld = async () => {
        const holder = await sql.reserve()
        await holder`begin`
        await holder`select id from hosts where id = 'src' for no key update`
        await holder`update hosts set reported_at = ${Date.now()}, version = version + 1 where id = 'src'`
        const [{ pid }] = (await holder`select pg_backend_pid() as pid`) as unknown as [{ pid: number }]
        return { holder, pid: Number(pid) }
      }
      /** The commit, begun while the report is held: whether it waited on the report's lock, then how it ended once the report `ends`. */
      const commitBeside = async (ends: "commit" | "rollback") => {
        const { holder, pid } = await reportHeld()
        let settled = false
        const committing = run(Effect.result(commit(move.id))).finally(() => {
          settled = true
        })
        let waiting = false
        try {
          // Bounded (60 s), not timed: the commit either waits on the report's lock or settles.
          for (let k = 0; k < 600 && !waiting && !settled; k++) {
            const [row] = await sql`select count(*)::int as n from pg_stat_activity where ${pid} = any(pg_blocking_pids(pid))`
            waiting = (row?.["n"] as number) > 0
            if (!waiting) await new Promise((r) => setTimeout(r, 100))
          }
        } finally {
          await (ends === "commit" ? holder`commit` : holder`rollback`)
          holder.release()
        }
        return { waiting, result: await committing }
      }

      await silence()
      // What the coordinator's check alone saw: a silent source, so it let the commit through.
      expect(Move.refuseOperatorCommit(await run(s.getMove(move.id)), await run(s.getHost("src")), Date.now(), limits)).toBeNull()
      const heard = await commitBeside("commit")
      expect(heard.waiting).toBe(true)
      expect(heard.result._tag).toBe("Failure")
      if (heard.result._tag === "Failure") {
        expect(heard.result.failure).toMatchObject({ _tag: "Conflict", entity: "move", id: move.id })
        expect((heard.result.failure as { reason: string }).reason).toMatch(/^the move's source src is heard \(its last report \d+ s ago, within the 60 s stale window\)/)
      }
      expect(await run(s.getMove(move.id))).toMatchObject({ state: "pending", endedAt: null })
      expect(await run(s.getSession("s1"))).toMatchObject({ state: "moving", hostId: "src" })

      // The report rolled back: the source is as silent as the commit found it before it waited.
      await silence()
      const unheard = await commitBeside("rollback")
      expect(unheard.waiting).toBe(true)
      expect(unheard.result).toMatchObject({ _tag: "Success", success: { id: move.id, state: "committed", phases: null } })
      expect(await run(s.getSession("s1"))).toMatchObject({ state: "running", hostId: "dst", reservationId: move.reservationId })
      expect(await run(pair.sumsDrift)).toStrictEqual([])
    } finally {
      await close()
      await sql.end()
      await db.drop()
    }
  }, 180_000)
})
