// The image host of sessions descended before image hosts were recorded: migration 0017 backfills
// it from their history (the host of the last `Descended` event, when the session has not run
// since), so placement ranks it first and the host's assignments list it as that host's image.
import { createHash } from "node:crypto"
import { readFileSync } from "node:fs"
import { freshDatabase } from "@engram/test-pg"
import { Effect } from "effect"
import postgres from "@engram/postgres"
import { describe, expect, it } from "vitest"
import { migrationsFolder, StorePg } from "../src/index.js"

describe("image hosts on an upgraded database", () => {
  it("are backfilled from each session's history: the last Descended host of a session that has not run since", async () => {
    const db = await freshDatabase()
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      // The schema as of the migrations before image hosts, applied by hand, with sessions in it.
      const journal = JSON.parse(readFileSync(`${migrationsFolder}/meta/_journal.json`, "utf8")) as { entries: { tag: string; when: number; idx: number }[] }
      await sql`create schema if not exists drizzle`
      await sql`create table drizzle.__drizzle_migrations (id serial primary key, hash text not null, created_at bigint)`
      for (const e of journal.entries.filter((x) => x.idx < 16)) {
        const text = readFileSync(`${migrationsFolder}/${e.tag}.sql`, "utf8")
        for (const stmt of text.split("--> statement-breakpoint")) if (stmt.trim() !== "") await sql.unsafe(stmt)
        await sql`insert into drizzle.__drizzle_migrations (hash, created_at) values (${createHash("sha256").update(text).digest("hex")}, ${e.when})`
      }
      await sql`insert into hosts (id, created_at) values ('a', 0), ('b', 0)`
      const sessions: [string, string, string | null][] = [
        ["descended", "descended", null],
        ["queued-after-descent", "queued", null],
        ["pending-after-descent", "pending", "b"],
        ["ran-again", "running", "b"],
        ["queued-create", "queued", null],
      ]
      for (const [id, state, hostId] of sessions)
        await sql`insert into sessions (id, state, mem_mib, vcpus, host_id, queued_at, created_at, updated_at) values (${id}, ${state}, 1024, 1, ${hostId}, ${state === "queued" ? 1 : null}, 0, 0)`
      const history: Record<string, unknown[]> = {
        descended: [{ _tag: "Running", hostId: "b" }, { _tag: "Descended", hostId: "b" }, { _tag: "Resumed", warm: false, hostId: null }, { _tag: "Running", hostId: "a" }, { _tag: "Descended", hostId: "a" }],
        "queued-after-descent": [{ _tag: "Running", hostId: "b" }, { _tag: "Descended", hostId: "b" }, { _tag: "Resumed", warm: false, hostId: null }, { _tag: "Queued" }],
        "pending-after-descent": [{ _tag: "Running", hostId: "a" }, { _tag: "Descended", hostId: "a" }, { _tag: "Resumed", warm: false, hostId: null }, { _tag: "Placed", hostId: "b" }],
        "ran-again": [{ _tag: "Running", hostId: "a" }, { _tag: "Descended", hostId: "a" }, { _tag: "Placed", hostId: "b" }, { _tag: "Running", hostId: "b" }],
        "queued-create": [{ _tag: "Created" }, { _tag: "Queued" }],
      }
      for (const [id, events] of Object.entries(history))
        for (const [i, event] of events.entries()) await sql`insert into session_events (session_id, seq, at, event) values (${id}, ${i + 1}, ${i}, ${sql.json(event as never)})`
      // Now the store's migrator applies the rest, including the backfill.
      const read = await Effect.runPromise(
        Effect.scoped(
          Effect.gen(function* () {
            const pair = yield* StorePg.openUrl({ url: db.url })
            const images = Object.fromEntries(yield* Effect.forEach(sessions, ([id]) => Effect.map(pair.store.getSession(id), (s) => [id, s.imageHostId] as const)))
            const listed = yield* Effect.forEach(["a", "b"], (h) => Effect.map(pair.store.hostAssignments(h), (x) => [h, x.imageSessionIds] as const))
            return { images, listed }
          }),
        ),
      )
      expect(read.images).toStrictEqual({
        descended: "a",
        "queued-after-descent": "b",
        "pending-after-descent": "a",
        "ran-again": null,
        "queued-create": null,
      })
      expect(read.listed).toStrictEqual([
        ["a", ["descended", "pending-after-descent"]],
        ["b", ["queued-after-descent"]],
      ])
    } finally {
      await sql.end()
      await db.drop()
    }
  }, 60_000)
})
