// A replica starting a rolling upgrade applies its new migration without stalling the running
// replicas: a migration whose table is held by another client's open transaction gives up its
// place after `lock_timeout` (rolled back, nothing half-applied) and tries again, rather than
// queueing every later statement on that table behind its wait. Real PostgreSQL.
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { drizzle } from "drizzle-orm/postgres-js"
import { migrate as drizzleMigrate } from "drizzle-orm/postgres-js/migrator"
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import postgres from "postgres"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Effect } from "effect"
import { migrationsFolder, StorePg } from "../src/index.js"
import { migrateUrl } from "../src/Migrate.js"
import { hostVersionBumpText } from "../src/schema.js"

let db: TestDatabase
let older: string
let entries: number
beforeAll(async () => {
  db = await freshDatabase()
  // The migrations of the release before: every one but the last.
  older = mkdtempSync(join(tmpdir(), "engram-migrations-"))
  cpSync(migrationsFolder, older, { recursive: true })
  const journal = JSON.parse(readFileSync(join(older, "meta", "_journal.json"), "utf8")) as { entries: unknown[] }
  entries = journal.entries.length
  journal.entries.pop()
  writeFileSync(join(older, "meta", "_journal.json"), JSON.stringify(journal))
  const client = postgres(db.url, { max: 1, onnotice: () => undefined })
  try {
    await drizzleMigrate(drizzle({ client }), { migrationsFolder: older })
  } finally {
    await client.end()
  }
}, 120_000)
afterAll(async () => {
  await db?.drop()
  if (older !== undefined) rmSync(older, { recursive: true, force: true })
})

const applied = async (url: string): Promise<number> => {
  const client = postgres(url, { max: 1, onnotice: () => undefined })
  try {
    const [row] = await client`select count(*)::int as n from drizzle.__drizzle_migrations`
    return (row as { n: number }).n
  } finally {
    await client.end()
  }
}

describe("migrations on a database in use", () => {
  it("a migration whose table another client holds gives up after lock_timeout and tries again; it applies once the table is free", async () => {
    expect(await applied(db.url)).toBe(entries - 1)
    // Another client's long transaction holding every table in a mode that conflicts with what
    // a migration takes, whatever the last one does (SHARE ROW EXCLUSIVE: against an ALTER's
    // ACCESS EXCLUSIVE, an UPDATE's ROW EXCLUSIVE and a CREATE INDEX's SHARE), left open.
    const holder = postgres(db.url, { max: 1, onnotice: () => undefined })
    const pauses: number[] = []
    try {
      const tables = (await holder`select tablename from pg_tables where schemaname = 'public'`).map((r) => `"${String(r["tablename"])}"`)
      expect(tables.length).toBeGreaterThan(3)
      let release!: () => void
      const released = new Promise<void>((ok) => (release = ok))
      let locked!: () => void
      const isLocked = new Promise<void>((ok) => (locked = ok))
      const holding = holder.begin(async (tx) => {
        await tx.unsafe(`lock table ${tables.join(", ")} in share row exclusive mode`)
        locked()
        await released
      })
      await isLocked
      const refused = await migrateUrl(db.url, { lockTimeoutMs: 100, attempts: 3, pause: async (n) => void pauses.push(n) }).then(
        () => undefined,
        (e: unknown) => e as Error,
      )
      expect(refused?.message).toBe(
        "a migration waited for a table's lock past lock_timeout 100 ms on each of 3 tries (another client holds a long transaction on it); nothing was applied by the last try",
      )
      expect(pauses).toEqual([1, 2])
      expect(await applied(db.url)).toBe(entries - 1)
      // The transaction it waited behind was never disturbed: it commits.
      release()
      await holding
      await migrateUrl(db.url, { lockTimeoutMs: 100, attempts: 3, pause: async (n) => void pauses.push(n) })
      expect(await applied(db.url)).toBe(entries)
      expect(pauses).toEqual([1, 2])
    } finally {
      await holder.end()
    }
  }, 120_000)

  it("options that break their rule are refused by name", async () => {
    await expect(migrateUrl(db.url, { lockTimeoutMs: 0 })).rejects.toThrow("lockTimeoutMs 0: must be an integer >= 1 (ms)")
    await expect(migrateUrl(db.url, { attempts: 1.5 })).rejects.toThrow("attempts 1.5: must be an integer >= 1")
  })
})

describe("migration 0019 (host versions from a sequence) on a database with hosts", () => {
  it("versions go on from above every version a host row had: a new host's and a bumped one's", async () => {
    const upgraded = await freshDatabase()
    const client = postgres(upgraded.url, { max: 1, onnotice: () => undefined })
    // The migrations before 0019, whatever comes after it.
    const before = mkdtempSync(join(tmpdir(), "engram-migrations-0018-"))
    cpSync(migrationsFolder, before, { recursive: true })
    const journal = JSON.parse(readFileSync(join(before, "meta", "_journal.json"), "utf8")) as { entries: { tag: string }[] }
    journal.entries = journal.entries.filter((e) => e.tag < "0019")
    writeFileSync(join(before, "meta", "_journal.json"), JSON.stringify(journal))
    try {
      // The release before: hosts whose versions counted up from 0, one of them far.
      await drizzleMigrate(drizzle({ client }), { migrationsFolder: before })
      await client`insert into hosts (id, created_at, version) values ('far', 1, 500), ('near', 1, 3)`
      await migrateUrl(upgraded.url)
      expect(await applied(upgraded.url)).toBe(entries)
      // 0019 and any later migration applied: a new host, and a bump of an old one.
      await client`insert into hosts (id, created_at) values ('new', 2)`
      await client.unsafe(`update hosts set version = ${hostVersionBumpText("version")} where id = 'near'`)
      const rows = await client`select id, version::int as version from hosts order by id`
      const version = new Map(rows.map((r) => [String(r["id"]), Number(r["version"])]))
      expect(version.get("far")).toBe(500)
      expect(version.get("new")).toBeGreaterThan(500)
      expect(version.get("near")).toBeGreaterThan(version.get("new") as number)
    } finally {
      await client.end()
      await upgraded.drop()
      rmSync(before, { recursive: true, force: true })
    }
  }, 120_000)
})

describe("migration 0021 (the token hash index unique) on a database with hosts", () => {
  it("hashes held by several hosts fail it naming the rule and the hosts, nothing applied; once rotated it applies and refuses a second holder", async () => {
    const upgraded = await freshDatabase()
    const client = postgres(upgraded.url, { max: 1, onnotice: () => undefined })
    // The migrations before 0021, whatever comes after it.
    const before = mkdtempSync(join(tmpdir(), "engram-migrations-0020-"))
    cpSync(migrationsFolder, before, { recursive: true })
    const journal = JSON.parse(readFileSync(join(before, "meta", "_journal.json"), "utf8")) as { entries: { tag: string }[] }
    journal.entries = journal.entries.filter((e) => e.tag < "0021")
    writeFileSync(join(before, "meta", "_journal.json"), JSON.stringify(journal))
    const unique = async () =>
      (await client`select i.indisunique as u from pg_index i join pg_class c on c.oid = i.indexrelid where c.relname = 'hosts_token_hash_idx'`)[0]?.["u"]
    try {
      await drizzleMigrate(drizzle({ client }), { migrationsFolder: before })
      const older = await applied(upgraded.url)
      // The release before took a hash twice: two hosts share one, the others hold their own or none.
      await client`insert into hosts (id, created_at, token_hash) values ('a', 1, 'shared'), ('b', 1, 'shared'), ('c', 1, 'own'), ('d', 1, null), ('e', 1, null)`
      const refused = await migrateUrl(upgraded.url).then(
        () => null,
        (e: unknown) => String(e instanceof Error ? e.message : e),
      )
      expect(refused).toContain("hosts.token_hash must be unique (a host token authenticates one host)")
      expect(refused).toContain("1 token hash(es) are held by several hosts (hosts sharing one: a, b)")
      expect(refused).not.toContain("shared")
      // Nothing applied: the index as it was, the hosts untouched.
      expect(await applied(upgraded.url)).toBe(older)
      expect(await unique()).toBe(false)
      expect((await client`select count(*)::int as n from hosts where token_hash = 'shared'`)[0]?.["n"]).toBe(2)
      // The operator rotates one of them: it applies, and a second holder is refused from then on.
      await client`update hosts set token_hash = 'rotated' where id = 'b'`
      await migrateUrl(upgraded.url)
      expect(await applied(upgraded.url)).toBe(entries)
      expect(await unique()).toBe(true)
      await expect(client`insert into hosts (id, created_at, token_hash) values ('f', 2, 'own')`).rejects.toMatchObject({ code: "23505" })
      await client`insert into hosts (id, created_at, token_hash) values ('g', 2, null)`
    } finally {
      await client.end()
      await upgraded.drop()
      rmSync(before, { recursive: true, force: true })
    }
  }, 120_000)
})

describe("migration 0022 (who committed a move) on a database with moves", () => {
  it("a move committed before it reads committedBy null; the column takes only source, target or operator", async () => {
    const upgraded = await freshDatabase()
    const client = postgres(upgraded.url, { max: 1, onnotice: () => undefined })
    // The migrations before 0022, whatever comes after it.
    const before = mkdtempSync(join(tmpdir(), "engram-migrations-0021-"))
    cpSync(migrationsFolder, before, { recursive: true })
    const journal = JSON.parse(readFileSync(join(before, "meta", "_journal.json"), "utf8")) as { entries: { tag: string }[] }
    journal.entries = journal.entries.filter((e) => e.tag < "0022")
    writeFileSync(join(before, "meta", "_journal.json"), JSON.stringify(journal))
    try {
      await drizzleMigrate(drizzle({ client }), { migrationsFolder: before })
      // The release before: a move committed (on a resolution: no phases), who committed it not kept.
      await client`insert into sessions (id, state, mem_mib, vcpus, created_at, updated_at) values ('s1', 'ended', 512, 1, 1, 3)`
      await client`insert into moves (id, session_id, source_host_id, target_host_id, reservation_id, max_downtime_ms, state, created_at, ended_at)
        values ('m1', 's1', 'a', 'b', 'r1', 600, 'committed', 1, 2)`
      await migrateUrl(upgraded.url)
      expect(await applied(upgraded.url)).toBe(entries)
      const opened = await Effect.runPromise(Effect.scoped(Effect.flatMap(StorePg.openUrl({ url: upgraded.url }), ({ store }) => store.getMove("m1"))))
      expect(opened).toMatchObject({ id: "m1", state: "committed", phases: null, committedBy: null })
      await client`update moves set committed_by = 'operator' where id = 'm1'`
      await expect(client`update moves set committed_by = 'agent' where id = 'm1'`).rejects.toMatchObject({ code: "23514" })
    } finally {
      await client.end()
      await upgraded.drop()
      rmSync(before, { recursive: true, force: true })
    }
  }, 120_000)
})
