// A group applied on the pool (one statement, no transaction) locks the host rows it writes in
// id order, as a transaction does (`lockHostsSql`): two replicas' groups over the same hosts then
// queue on the first host instead of each holding one and waiting on the other (a deadlock the
// server breaks after `deadlock_timeout`, failing a group that is retried: a stall).
import { Session } from "@engram/core"
import type { Plan } from "@engram/core"
import { freshDatabase } from "@engram/test-pg"
import postgres from "@engram/postgres"
import { PgDialect } from "drizzle-orm/pg-core"
import { describe, expect, it } from "vitest"
import { applySql, docOf } from "../src/Apply.js"
import { migrate } from "../src/index.js"
import { drizzleOn } from "../src/PostgresJs.js"

const create = (id: string, hostId: string, version: number): Plan.Plan => {
  const answer = Session.step(
    null,
    { _tag: "create", id, budget: { memMib: 512, vcpus: 1 }, affinity: [], placement: { hostId, version, reservationId: `r-${id}` } },
    1,
  )
  expect(answer._tag).toBe("Plan")
  return answer as Plan.Plan
}

describe("a group on the pool", () => {
  it("locks its hosts in id order, whatever order its plans and the hosts' rows are in", async () => {
    const db = await freshDatabase()
    const sql = postgres(db.url, { max: 8, onnotice: () => undefined })
    try {
      await migrate(db.url)
      // z's row is stored before a's: a scan in storage order visits z first.
      for (const id of ["z", "a"])
        await sql`insert into hosts (id, state, total_mib, allocatable_mib, total_vcpus, reported_at, created_at, reserved_mem_mib, reserved_vcpus, entries)
          values (${id}, 'ready', 1048576, 1048576, 64, 0, 0, 0, 0, 0)`
      await sql`analyze hosts`
      const versions = new Map((await sql`select id, version from hosts`).map((r) => [r["id"] as string, Number(r["version"])]))
      // The plans visit z first, too.
      const plans = [create("s-z", "z", versions.get("z")!), create("s-a", "a", versions.get("a")!)]
      drizzleOn(sql)
      const q = new PgDialect().sqlToQuery(applySql(docOf(plans)))
      // A third party holds host a.
      const holder = await sql.reserve()
      await holder`begin`
      await holder`select id from hosts where id = 'a' for update`
      const group = await sql.reserve()
      const [{ pid }] = (await group`select pg_backend_pid() as pid`) as unknown as [{ pid: number }]
      const applying = group.unsafe(q.sql, q.params as never[]).then((rows) => rows)
      applying.catch(() => undefined)
      let waiting = false
      let probed: unknown = null
      try {
        // The group waits for a lock (polled, bounded: 60 s)...
        for (let k = 0; k < 600 && !waiting; k++) {
          const [row] = await sql`select wait_event_type from pg_stat_activity where pid = ${pid}`
          waiting = row?.["wait_event_type"] === "Lock"
          if (!waiting) await new Promise((r) => setTimeout(r, 100))
        }
        // ...on host a, holding no host after it: z is free to take at once.
        probed = await sql
          .begin((probe) => probe`select id from hosts where id = 'z' for no key update nowait`)
          .then(
            (rows) => rows.map((r) => r["id"] as string),
            (e: { code?: string; message?: string }) => `${e.code}: ${e.message}`,
          )
      } finally {
        // Released, the group writes both plans.
        await holder`commit`
        holder.release()
      }
      const [row] = await applying
      group.release()
      expect(waiting).toBe(true)
      expect(probed).toStrictEqual(["z"])
      const outcomes = (typeof row?.["outcomes"] === "string" ? JSON.parse(row["outcomes"]) : row?.["outcomes"]) as { ok: boolean }[]
      expect(outcomes.map((o) => o.ok)).toStrictEqual([true, true])
      const reserved = await sql`select id, entries from hosts order by id`
      expect(reserved.map((r) => [r["id"], Number(r["entries"])])).toStrictEqual([
        ["a", 1],
        ["z", 1],
      ])
    } finally {
      await sql.end()
      await db.drop()
    }
  }, 120_000)
})
