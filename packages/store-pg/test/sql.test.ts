// The SQL paths beyond the shared suite: migrations applied again (and at once from two
// replicas), the typed errors when the server goes away, and a PGlite data directory that
// survives a restart.
import { createHash } from "node:crypto"
import { readFileSync } from "node:fs"
import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import path from "node:path"
import { Limits } from "@engram/core"
import { Store } from "@engram/store"
import { freePort, freshDatabase, startEmbeddedPostgres } from "@engram/test-pg"
import { Effect, Exit, Layer, ManagedRuntime } from "effect"
import postgres from "@engram/postgres"
import { it as effectIt } from "@effect/vitest"
import { TestClock } from "effect/testing"
import { describe, expect, it } from "vitest"
import { migrate, migrationsFolder, StorePg } from "../src/index.js"
import { lockedSession, MigrationLockLost, migrateUrl } from "../src/Migrate.js"
import { hostsOf, sessionAttrsFor } from "../src/SessionAttrs.js"
import { Harness } from "@engram/store-conformance"

const failureOf = <A, E>(exit: Exit.Exit<A, E>): unknown =>
  Exit.isFailure(exit) ? (exit.cause.reasons.find((r) => r._tag === "Fail") as { error: unknown } | undefined)?.error : undefined

describe("migrations", () => {
  it("applying the migrations twice, and from two replicas at once, changes nothing", async () => {
    const db = await freshDatabase()
    try {
      await Promise.all([migrate(db.url), migrate(db.url)])
      await migrate(db.url)
      const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
      try {
        const applied = await sql`select count(*)::int as n from drizzle.__drizzle_migrations`
        // Every committed migration, applied once: the journal drizzle-kit writes lists them.
        const journal = JSON.parse(readFileSync(path.join(migrationsFolder, "meta", "_journal.json"), "utf8")) as { entries: unknown[] }
        expect(journal.entries.length).toBeGreaterThanOrEqual(5)
        expect(applied[0]?.["n"]).toBe(journal.entries.length)
        const tables = await sql`select table_name from information_schema.tables
          where table_schema = 'public' and table_type = 'BASE TABLE' order by 1`
        expect(tables.map((t) => t["table_name"])).toStrictEqual(["hosts", "leases", "metrics", "move_pairs", "moves", "reservations", "session_events", "sessions"])
        const views = await sql`select table_name from information_schema.views where table_schema = 'public'`
        expect(views.map((t) => t["table_name"])).toStrictEqual(["host_reserved_sums"])
        // CHECK constraints are the last line of defence.
        await expect(sql`insert into sessions (id, state, mem_mib, vcpus, created_at, updated_at) values ('x', 'pending', 0, 1, 0, 0)`).rejects.toMatchObject({
          code: "23514",
        })
        await expect(sql`insert into hosts (id, state, created_at) values ('h', 'gone', 0)`).rejects.toMatchObject({ code: "23514" })
        // No negative maintained sums.
        await sql`insert into hosts (id, created_at) values ('ok', 0)`
        for (const column of ["reserved_mem_mib", "reserved_vcpus", "entries"])
          await expect(sql`update hosts set ${sql(column)} = -1 where id = 'ok'`).rejects.toMatchObject({ code: "23514" })
      } finally {
        await sql.end()
      }
    } finally {
      await db.drop()
    }
  })

  it("commits kept before their times were (migration 0011) take their pair's last commit time", async () => {
    const db = await freshDatabase()
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      // The schema as of the migrations before 0011, applied by hand, with a pair's history in it.
      const journal = JSON.parse(readFileSync(path.join(migrationsFolder, "meta", "_journal.json"), "utf8")) as { entries: { tag: string; when: number; idx: number }[] }
      await sql`create schema if not exists drizzle`
      await sql`create table drizzle.__drizzle_migrations (id serial primary key, hash text not null, created_at bigint)`
      for (const e of journal.entries.filter((e) => e.idx < 11)) {
        const text = readFileSync(path.join(migrationsFolder, `${e.tag}.sql`), "utf8")
        for (const stmt of text.split("--> statement-breakpoint")) if (stmt.trim() !== "") await sql.unsafe(stmt)
        await sql`insert into drizzle.__drizzle_migrations (hash, created_at) values (${createHash("sha256").update(text).digest("hex")}, ${e.when})`
      }
      await sql`insert into move_pairs (source_host_id, target_host_id, commits_ms, updated_at) values ('a', 'b', '[900, 950]'::jsonb, 5000), ('b', 'a', '[]'::jsonb, 7000)`
      // Now the store's migrator applies the rest, including the backfill.
      const pairs = await Effect.runPromise(Effect.scoped(Effect.flatMap(StorePg.openUrl({ url: db.url }), (p) => p.store.listPairCommits())))
      expect(pairs.map((p) => [p.sourceHostId, p.commitsMs, p.recordedAtMs])).toStrictEqual([
        ["a", [900, 950], [5000, 5000]],
        ["b", [], []],
      ])
    } finally {
      await sql.end()
      await db.drop()
    }
  }, 60_000)
})

describe("errors", () => {
  it("a store whose server went away answers Unavailable with a retry hint, and changes nothing", async () => {
    const server = await startEmbeddedPostgres()
    const runtime = ManagedRuntime.make(StorePg.layer({ url: server.url, poolSize: 2, connectTimeoutSec: 2 }))
    try {
      await runtime.runPromise(Store.use((s) => s.registerHost({ id: "h1" })))
      await server.stop()
      const exit = await runtime.runPromiseExit(Store.use((s) => s.registerHost({ id: "h2" })))
      const error = failureOf(exit)
      expect(error).toMatchObject({ _tag: "Unavailable", retryAfterMs: 1000 })
      const read = await runtime.runPromiseExit(Store.use((s) => Harness.hostsNow(s)))
      expect(failureOf(read)).toMatchObject({ _tag: "Unavailable" })
    } finally {
      await runtime.dispose()
      await server.stop()
    }
  })

  it("starting against a server that refuses connections fails with Unavailable", async () => {
    const port = await freePort()
    const exit = await Effect.runPromiseExit(
      Effect.scoped(Layer.build(StorePg.layer({ url: `postgres://postgres:postgres@127.0.0.1:${port}/postgres`, connectTimeoutSec: 2 }))),
    )
    expect(failureOf(exit)).toMatchObject({ _tag: "Unavailable" })
  })

  it("a duplicate host is a Conflict, not a driver error", async () => {
    const db = await freshDatabase()
    const runtime = ManagedRuntime.make(StorePg.layer({ url: db.url }))
    try {
      await runtime.runPromise(Store.use((s) => s.registerHost({ id: "h1" })))
      const exit = await runtime.runPromiseExit(Store.use((s) => s.registerHost({ id: "h1" })))
      expect(failureOf(exit)).toMatchObject({ _tag: "Conflict", entity: "host", id: "h1" })
    } finally {
      await runtime.dispose()
      await db.drop()
    }
  })
})

describe("reclaim", () => {
  // On the TestClock (the store's time is the Effect Clock): the steps before the window take no
  // time of it, however slow the machine (on the wall clock a loaded CI took the steps past a
  // 1 s window: its hosts went silent and a move found no target), and the window passes at once.
  effectIt.effect("a moving session whose own and target entries are both stale ends lost, whichever entry id sorts first", () =>
    Effect.gen(function* () {
      const db = yield* Effect.acquireRelease(Effect.promise(() => freshDatabase()), (d) => Effect.promise(() => d.drop()))
      // A short window: a host whose agent has not reported for a window is silent and takes no
      // placement (`Placement.isSilent`), so the hosts report before each session's steps.
      const windowMs = 1000
      const limits = { ...Limits.defaults, heartbeatStaleWindowMs: windowMs }
      const s = (yield* StorePg.openUrl({ url: db.url, limits })).store
      const ids = Array.from({ length: 12 }, (_, i) => `s${i}`)
      // Each advertises a peer URL: a move without a target goes only to a host that takes moves.
      const report = (h: string) => s.reportHost(h, { totalMib: 65536, allocatableMib: 65536, totalVcpus: 64, peerUrl: Harness.peerUrlOf(h) })
      for (const h of ["h1", "h2"]) yield* s.registerHost({ id: h })
      for (const id of ids) {
        for (const h of ["h1", "h2"]) yield* report(h)
        yield* s.createSession({ id, budget: { memMib: 1024, vcpus: 1 } })
        yield* s.markRunning(id)
        yield* s.beginMove({ sessionId: id, maxDowntimeMs: 600 })
      }
      // Random entry ids: with 12 sessions both orders (session entry first, move entry first) occur.
      yield* TestClock.adjust(windowMs + 20)
      const result = yield* s.reclaim()
      expect(result.lostSessions).toStrictEqual([...ids].sort())
      expect(result.reclaimed).toHaveLength(24)
      const sessions = yield* s.listSessions()
      expect(sessions.map((x) => [x.state, x.hostId, x.reservationId])).toStrictEqual(ids.map(() => ["lost", null, null]))
      const open = yield* Effect.forEach(ids, (id) => s.openMove(id))
      expect(open.every((m) => m === null)).toBe(true)
      expect(yield* Harness.reservationsNow(s)).toStrictEqual([])
    }).pipe(Effect.scoped),
  )
})

describe("PGlite", () => {
  it("a data directory keeps the store across a restart", async () => {
    const dataDir = await mkdtemp(path.join(tmpdir(), "engram-pglite-"))
    try {
      const first = ManagedRuntime.make(StorePg.layerPglite({ dataDir }))
      await first.runPromise(
        Store.use((s) =>
          Effect.andThen(s.registerHost({ id: "h1" }), s.reportHost("h1", { totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 })),
        ),
      )
      await first.runPromise(Store.use((s) => s.createSession({ id: "s1", budget: { memMib: 1024, vcpus: 1 } })))
      await first.dispose()
      const second = ManagedRuntime.make(StorePg.layerPglite({ dataDir }))
      try {
        const s1 = await second.runPromise(Store.use((s) => s.getSession("s1")))
        expect(s1).toMatchObject({ state: "pending", hostId: "h1" })
        const view = await second.runPromise(Store.use((s) => s.getHost("h1")))
        expect(view.headroom.reserved).toStrictEqual({ memMib: 1024, vcpus: 1 })
      } finally {
        await second.dispose()
      }
    } finally {
      await rm(dataDir, { recursive: true, force: true })
    }
  }, 300_000)
})

describe("the migration lock", () => {
  it("a migration whose connection was ended (its lock with it) runs nothing more on another connection", async () => {
    const db = await freshDatabase()
    const admin = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      const session = await lockedSession(db.url, 60_000)
      const [{ pid }] = (await session`select pg_backend_pid() as pid`) as unknown as [{ pid: number }]
      await admin`select pg_terminate_backend(${pid})`
      // Until the driver hears of the close, a statement fails on the dead connection; once it has, every statement is refused.
      let refused: unknown = undefined
      for (let i = 0; i < 200 && !(refused instanceof MigrationLockLost); i++) {
        refused = await Promise.resolve().then(() => session.unsafe("select 1")).then(() => "answered", (e: unknown) => e)
        expect(refused, "no statement is answered on another connection").not.toBe("answered")
        if (!(refused instanceof MigrationLockLost)) await new Promise((r) => setTimeout(r, 25))
      }
      expect(refused).toBeInstanceOf(MigrationLockLost)
      await expect(Promise.resolve().then(() => session`select 1`)).rejects.toBeInstanceOf(MigrationLockLost)
      expect((await admin`select count(*)::int as n from pg_locks where locktype = 'advisory' and granted`)[0]?.["n"]).toBe(0)
      await session.end({ timeout: 0 })
    } finally {
      await admin.end()
      await db.drop()
    }
  }, 60_000)

  it("a replica frozen while it holds the lock (its client sends nothing, its socket open) is ended by the server: the next replica's migrations go on", async () => {
    const db = await freshDatabase()
    try {
      // The frozen replica: it took the lock as a migration does, then stopped.
      const frozen = await lockedSession(db.url, 500)
      // The frozen replica's session is ended after 500 ms of silence; this replica's own bound is
      // generous (a loaded machine can leave a migrating client silent for longer than 500 ms
      // between its statements, and the server would end it too: c118).
      await migrateUrl(db.url, { idleTimeoutMs: 30_000 })
      const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
      try {
        expect((await sql`select count(*)::int as n from drizzle.__drizzle_migrations`)[0]?.["n"]).toBeGreaterThan(0)
        // The frozen session is gone: the server ended it.
        expect((await sql`select count(*)::int as n from pg_locks where locktype = 'advisory' and granted`)[0]?.["n"]).toBe(0)
      } finally {
        await sql.end()
      }
      await frozen.end({ timeout: 0 }).catch(() => undefined)
    } finally {
      await db.drop()
    }
  }, 60_000)
})

describe("a URL naming several hosts (a primary and its standbys, as libpq takes them)", () => {
  it("the store takes the server that writes, wherever it stands in the list: migrations, writes and reads land there", async () => {
    const [reader, writer] = await Promise.all([startEmbeddedPostgres(), startEmbeddedPostgres()])
    try {
      for (const server of [reader, writer]) {
        const admin = postgres(server.url, { max: 1, onnotice: () => undefined })
        await admin.unsafe("create database engram")
        // The reader reports itself read-only at connection start, as a hot standby does.
        if (server === reader) await admin.unsafe("alter database engram set default_transaction_read_only = on")
        await admin.end()
      }
      const at = (hosts: string) => `postgres://postgres:postgres@${hosts}/engram`
      // The reader alone: the migrations' writes are refused (this is the server the list skips).
      const alone = await Effect.runPromiseExit(Effect.scoped(Layer.build(StorePg.layer({ url: at(`127.0.0.1:${reader.port}`), connectTimeoutSec: 2 }))))
      expect(String(failureOf(alone) instanceof Error ? (failureOf(alone) as Error).message : JSON.stringify(failureOf(alone)))).toMatch(/read-only/)
      const runtime = ManagedRuntime.make(StorePg.layer({ url: at(`127.0.0.1:${reader.port},127.0.0.1:${writer.port}`), poolSize: 2 }))
      try {
        await runtime.runPromise(Store.use((s) => s.registerHost({ id: "h1" })))
        expect((await runtime.runPromise(Store.use((s) => Harness.hostsNow(s)))).map((h) => h.id)).toEqual(["h1"])
      } finally {
        await runtime.dispose()
      }
      const check = postgres(at(`127.0.0.1:${writer.port}`), { max: 1, onnotice: () => undefined })
      expect((await check`select id from hosts`).map((r) => r["id"])).toEqual(["h1"])
      await check.end()
    } finally {
      await Promise.all([reader.stop(), writer.stop()])
    }
  }, 60_000)

  it("read-write is the default only where the URL names several hosts and neither it nor PGTARGETSESSIONATTRS chooses", () => {
    expect(hostsOf("postgres://u:p@db1:5432,db2:5433/engram?sslmode=require")).toEqual(["db1:5432", "db2:5433"])
    expect(hostsOf("postgres://u:p%40x@db1/engram")).toEqual(["db1"])
    expect(sessionAttrsFor("postgres://u:p@db1,db2/engram", {})).toEqual({ target_session_attrs: "read-write" })
    expect(sessionAttrsFor("postgres://u:p@db1/engram", {})).toEqual({})
    expect(sessionAttrsFor("postgres://u:p@db1,db2/engram?target_session_attrs=primary", {})).toEqual({})
    expect(sessionAttrsFor("postgres://u:p@db1,db2/engram", { PGTARGETSESSIONATTRS: "prefer-standby" })).toEqual({})
  })
})
