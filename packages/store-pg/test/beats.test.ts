// Grouped heartbeats, host reports and guest activity on a real PostgreSQL (what the shared suite cannot see):
// many agents' heartbeats and reports land in few transactions (counted by a statement-level
// trigger that logs each writing transaction's id), each caller still gets its own answer (an
// unknown id fails its caller alone), and a group whose backend is terminated mid-statement
// fails every caller of the group and changes no row.
import { Limits } from "@engram/core"
import type { StoreShape } from "@engram/store"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { Effect } from "effect"
import postgres from "@engram/postgres"
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest"
import { StorePg } from "../src/index.js"
import type { StorePair } from "../src/StorePg.js"
import { openUrl } from "./open.js"

const limits: Limits.Limits = { ...Limits.defaults, maxEntriesPerNode: 256 }
const HOSTS = 60

/** Each writing transaction that updates `reservations` or `hosts` logs its id once per statement. */
const countingSql = `
  create table beat_log (tx bigint not null, tbl text not null);
  create table beat_slow (on_table text primary key);
  create function log_beat() returns trigger language plpgsql as $$
  begin
    insert into beat_log values (txid_current(), TG_TABLE_NAME);
    if exists (select 1 from beat_slow where on_table = TG_TABLE_NAME) then perform pg_sleep(20); end if;
    return null;
  end $$;
  create trigger log_beat after update on reservations for each statement execute function log_beat();
  create trigger log_beat after update on hosts for each statement execute function log_beat();
  create trigger log_beat after update on sessions for each statement execute function log_beat();`

/** What each call answered: its value, or its error's tag (and entity, for a NotFound). */
const answersOf = <A>(effects: readonly Effect.Effect<A, { readonly _tag: string }>[]) =>
  Effect.runPromise(
    Effect.all(
      effects.map((e) =>
        Effect.match(e, {
          onSuccess: (value) => ({ ok: true as const, value }),
          onFailure: (error) => ({ ok: false as const, error: error._tag === "NotFound" ? `NotFound ${(error as unknown as { entity: string }).entity}` : error._tag }),
        }),
      ),
      { concurrency: "unbounded" },
    ),
  )

describe("grouped heartbeats and reports on PostgreSQL", () => {
  let db: TestDatabase
  let sql: postgres.Sql
  let store: { pair: StorePair; close: () => Promise<void> }
  let s: StoreShape
  const hostIds = Array.from({ length: HOSTS }, (_, i) => `h${String(i).padStart(2, "0")}`)
  // Host i holds i % 3 sessions: hosts answer different renewal counts.
  const residents = (i: number) => i % 3

  const transactionsOn = async (table: string): Promise<number> =>
    Number((await sql<{ n: string }[]>`select count(distinct tx)::text as n from beat_log where tbl = ${table}`)[0]?.n)
  /** Each reservation's last heartbeat, by id. */
  const heartbeats = async (): Promise<Map<string, number>> =>
    new Map((await sql<{ id: string; at: string }[]>`select id, last_heartbeat_at::text as at from reservations`).map((r) => [r.id, Number(r.at)]))
  const hostOf = async (): Promise<Map<string, string>> =>
    new Map((await sql<{ id: string; host: string }[]>`select id, host_id as host from reservations`).map((r) => [r.id, r.host]))

  /**
   * Terminates the grouped statement's backend while its trigger sleeps. It waits for the sleep
   * itself (`PgSleep`), not only for the statement to be active. Seen active before its trigger
   * ran, the statement lost the race with the `delete from beat_slow` below: the trigger's query
   * takes a fresh snapshot (READ COMMITTED), finds no row and does not sleep, the group commits,
   * and the backend terminated is an idle one, so every caller is answered (CI run c26; an
   * UPDATE held 2 s before such a trigger, with the row deleted 0.7 s in, ends after 2 s, not 22).
   */
  const terminateGroup = async (): Promise<void> => {
    let pid: number | undefined
    for (let i = 0; i < 400 && pid === undefined; i++) {
      const [row] = await sql<{ pid: number }[]>`select pid from pg_stat_activity
        where datname = current_database() and state = 'active' and query like '%jsonb_to_recordset%' and pid <> pg_backend_pid()
          and wait_event = 'PgSleep'`
      pid = row?.pid
      if (pid === undefined) await new Promise((r) => setTimeout(r, 25))
    }
    expect(pid).toBeDefined()
    await sql`delete from beat_slow`
    await sql`select pg_terminate_backend(${pid ?? -1})`
  }

  beforeAll(async () => {
    db = await freshDatabase()
    sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    store = await openUrl(db.url, { limits, beatWindowMs: 20 })
    s = store.pair.store
    await sql.unsafe(countingSql)
    await Effect.runPromise(
      Effect.forEach(
        hostIds,
        (id, i) =>
          Effect.gen(function* () {
            yield* s.registerHost({ id })
            yield* s.reportHost(id, { totalMib: 65536, allocatableMib: 65536, totalVcpus: 16 })
            for (let k = 0; k < residents(i); k++) yield* s.createSession({ id: `${id}-s${k}`, budget: { memMib: 256, vcpus: 1 }, affinity: [id] })
          }),
        { discard: true },
      ),
    )
  })
  beforeEach(async () => {
    await sql`truncate beat_log, beat_slow`
  })
  afterAll(async () => {
    await store?.close()
    await sql?.end()
    await db?.drop()
  })

  it("60 host heartbeats at once are written by a few transactions, each host answered with its own count", async () => {
    const answers = await answersOf(hostIds.map((id) => s.heartbeatHost(id)))
    expect(answers).toStrictEqual(hostIds.map((_, i) => ({ ok: true, value: residents(i) })))
    // One by one this is 60 (the next test shows the count does count).
    expect(await transactionsOn("reservations")).toBeLessThanOrEqual(3)
  })

  it("heartbeats one after the other are a transaction each (the count is real)", async () => {
    for (const id of hostIds.slice(0, 5)) await Effect.runPromise(s.heartbeatHost(id))
    expect(await transactionsOn("reservations")).toBe(5)
  })

  it("an unknown host in a group fails only its own caller, with NotFound; the others are renewed", async () => {
    const before = await heartbeats()
    await new Promise((r) => setTimeout(r, 5))
    const ids = [...hostIds.slice(0, 20), "no-such-host", ...hostIds.slice(20, 40)]
    const answers = await answersOf(ids.map((id) => s.heartbeatHost(id)))
    expect(answers[20]).toStrictEqual({ ok: false, error: "NotFound host" })
    expect(answers.filter((a) => a.ok)).toHaveLength(40)
    const after = await heartbeats()
    const hosts = await hostOf()
    expect(after.size).toBe(hostIds.reduce((n, _, i) => n + residents(i), 0))
    for (const [id, at] of after) {
      const host = Number(hosts.get(id)?.slice(1))
      if (host < 40) expect(at, id).toBeGreaterThan(before.get(id) as number)
      else expect(at, id).toBe(before.get(id))
    }
  })

  it("reservation heartbeats at once share a transaction; an unknown reservation fails alone", async () => {
    const ids = [...(await heartbeats()).keys()].sort()
    const asked = [...ids.slice(0, 10), "no-such-reservation", ...ids.slice(10)]
    const answers = await answersOf(asked.map((id) => s.heartbeat(id)))
    expect(answers[10]).toStrictEqual({ ok: false, error: "NotFound reservation" })
    answers.forEach((a, i) => {
      if (i !== 10) expect(a.ok && a.value.id).toBe(asked[i])
    })
    expect(await transactionsOn("reservations")).toBeLessThanOrEqual(3)
  })

  it("60 reports at once are written by a few transactions, each answered with its own host's view", async () => {
    const reports = hostIds.map((_, i) => ({ totalMib: 65536, allocatableMib: 60000 - i, totalVcpus: 16 }))
    const answers = await answersOf(hostIds.map((id, i) => s.reportHost(id, reports[i] as (typeof reports)[number])))
    answers.forEach((a, i) => {
      expect(a.ok && [a.value.id, a.value.report?.allocatableMib, a.value.entries]).toStrictEqual([hostIds[i], 60000 - i, residents(i)])
    })
    expect(await transactionsOn("hosts")).toBeLessThanOrEqual(3)
    const stored = await sql<{ id: string; a: number }[]>`select id, allocatable_mib as a from hosts order by id`
    expect(stored.map((r) => [r.id, r.a])).toStrictEqual(hostIds.map((id, i) => [id, 60000 - i]))
  })

  it("in a group of reports, an unknown host and a bad report fail alone", async () => {
    const good = hostIds.slice(0, 10)
    const answers = await answersOf([
      ...good.map((id) => s.reportHost(id, { totalMib: 65536, allocatableMib: 50000, totalVcpus: 16 })),
      s.reportHost("no-such-host", { totalMib: 65536, allocatableMib: 50000, totalVcpus: 16 }),
      s.reportHost(hostIds[10] as string, { totalMib: 1000, allocatableMib: 2000, totalVcpus: 16 }),
    ])
    expect(answers.slice(0, 10).every((a) => a.ok && a.value.report?.allocatableMib === 50000)).toBe(true)
    expect(answers[10]).toStrictEqual({ ok: false, error: "NotFound host" })
    expect(answers[11]).toStrictEqual({ ok: false, error: "InvalidInput" })
    const [h10] = await sql<{ a: number }[]>`select allocatable_mib as a from hosts where id = ${hostIds[10] as string}`
    expect(h10?.a).toBe(60000 - 10)
  })

  it("60 hosts' guest activity at once is written by a few transactions; each host's answer counts its own running sessions", async () => {
    const running = hostIds.flatMap((id, i) => Array.from({ length: residents(i) }, (_, k) => `${id}-s${k}`))
    await Effect.runPromise(Effect.forEach(running, (id) => Effect.ignore(s.markRunning(id)), { discard: true }))
    await sql`truncate beat_log`
    const lastActive = async () => new Map((await sql<{ id: string; at: string }[]>`select id, last_active_at::text as at from sessions`).map((r) => [r.id, Number(r.at)]))
    const before = await lastActive()
    await new Promise((r) => setTimeout(r, 5))
    // Each host names its own sessions, one a session of another host (not its own: not touched) and one unknown.
    const answers = await answersOf(hostIds.map((id, i) => s.recordActivity(id, [...Array.from({ length: residents(i) }, (_, k) => `${id}-s${k}`), "h02-s1", "nobody"])))
    expect(answers).toStrictEqual(hostIds.map((id, i) => ({ ok: true, value: residents(i) })))
    expect(await transactionsOn("sessions")).toBeLessThanOrEqual(3)
    const after = await lastActive()
    for (const id of running) expect(after.get(id), id).toBeGreaterThan(before.get(id) as number)
  })

  it("a group whose backend is terminated mid-statement: each caller is answered Unavailable with its rows unchanged, or written; none is left half written", async () => {
    const before = await heartbeats()
    await new Promise((r) => setTimeout(r, 5))
    await sql`insert into beat_slow values ('reservations')`
    const pending = answersOf(hostIds.map((id) => s.heartbeatHost(id)))
    await terminateGroup()
    const answers = await pending
    // The terminated group's callers are answered Unavailable and none of their rows changed. On
    // a loaded machine some calls may come too late for that group: the next group, run once
    // the backend is gone, writes theirs (answered, and their rows renewed). Either way each
    // caller's answer says what happened to its rows: none is left half written.
    expect(answers.filter((a) => !a.ok && a.error !== "Unavailable")).toStrictEqual([])
    const failed = new Set(hostIds.filter((_, i) => answers[i]?.ok === false))
    // The group terminated in its sleep had callers: they failed.
    expect(failed.size).toBeGreaterThan(0)
    const hostOfReservation = await hostOf()
    const whileTerminated = await heartbeats()
    for (const [id, at] of whileTerminated) {
      if (failed.has(hostOfReservation.get(id) as string)) expect(at, id).toBe(before.get(id))
      else expect(at, id).toBeGreaterThan(before.get(id) as number)
    }
    // The store goes on: the next group is written.
    const again = await answersOf(hostIds.map((id) => s.heartbeatHost(id)))
    expect(again.every((a) => a.ok)).toBe(true)
    const after = await heartbeats()
    for (const [id, at] of after) expect(at, id).toBeGreaterThan(before.get(id) as number)
  })

  it("a group of reports whose backend is terminated: each caller is answered Unavailable with its host unchanged, or written", async () => {
    const hostsNow = async () => await sql<{ id: string; a: number; v: string }[]>`select id, allocatable_mib as a, version::text as v from hosts order by id`
    const before = await hostsNow()
    await sql`insert into beat_slow values ('hosts')`
    const pending = answersOf(hostIds.map((id) => s.reportHost(id, { totalMib: 65536, allocatableMib: 1234, totalVcpus: 16 })))
    await terminateGroup()
    const answers = await pending
    // As with heartbeats: the terminated group's callers are Unavailable and their hosts as
    // before; a report too late for that group is written by the next one.
    expect(answers.filter((a) => !a.ok && a.error !== "Unavailable")).toStrictEqual([])
    const failed = new Set(hostIds.filter((_, i) => answers[i]?.ok === false))
    expect(failed.size).toBeGreaterThan(0)
    const after = await hostsNow()
    expect(after.filter((h) => failed.has(h.id))).toStrictEqual(before.filter((h) => failed.has(h.id)))
    expect(after.filter((h) => !failed.has(h.id)).every((h) => h.a === 1234)).toBe(true)
  })
})

describe("grouped heartbeats on PGlite", () => {
  // Most of it is opening PGlite and migrating it: about 5 s alone, 102 s in a CI run on a
  // loaded machine (with 180 s of timeout), so it gets the bound the other PGlite files have.
  it("heartbeats and reports at once each get their own answer", { timeout: 600_000 }, async () => {
    await Effect.runPromise(
      Effect.scoped(
        Effect.gen(function* () {
          const pair = yield* StorePg.openPglite({ limits, beatWindowMs: 5 })
          const s = pair.store
          for (const id of ["a", "b", "c"]) {
            yield* s.registerHost({ id })
            yield* s.reportHost(id, { totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 })
          }
          yield* s.createSession({ id: "s1", budget: { memMib: 256, vcpus: 1 }, affinity: ["b"] })
          const beats = yield* Effect.all(
            ["a", "b", "nope", "c"].map((id) => Effect.result(s.heartbeatHost(id))),
            { concurrency: "unbounded" },
          )
          expect(beats.map((r) => (r._tag === "Success" ? r.success : r.failure._tag))).toStrictEqual([0, 1, "NotFound", 0])
          const reports = yield* Effect.all(
            ["a", "nope", "c"].map((id) => Effect.result(s.reportHost(id, { totalMib: 8192, allocatableMib: 4096, totalVcpus: 4 }))),
            { concurrency: "unbounded" },
          )
          expect(reports.map((r) => (r._tag === "Success" ? r.success.report?.allocatableMib : r.failure._tag))).toStrictEqual([4096, "NotFound", 4096])
        }),
      ),
    )
  })
})
