// The coordinator's process (`src/main.ts`, as operators run it) when it cannot start: a port
// in use and a database that refuses are each one line naming the setting, and exit 1.
import { createServer } from "node:net"
import type { Server } from "node:net"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import postgres from "@engram/postgres"
import { startEmbeddedPostgres } from "@engram/test-pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { runToEnd } from "./support/child.js"

const dataDir = mkdtempSync(join(tmpdir(), "engram-main-"))
let holder: Server
let heldPort = 0

beforeAll(async () => {
  holder = createServer()
  await new Promise<void>((r) => holder.listen(0, "127.0.0.1", () => r()))
  heldPort = (holder.address() as { port: number }).port
})
afterAll(() => {
  holder?.close()
  rmSync(dataDir, { recursive: true, force: true })
})

/** Runs the coordinator on this file's data dir to its end, with `env` over the test's environment. */
const run = (env: Record<string, string>) => {
  const clean = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("ENGRAM_")))
  return runToEnd({ ...clean, ENGRAM_DATA_DIR: dataDir, ...env })
}

describe("the coordinator's start-up failures", () => {
  it("a port in use: one line naming the port and ENGRAM_PORT, exit 1", async () => {
    const r = await run({ ENGRAM_PORT: String(heldPort), ENGRAM_ADMIN_TOKEN: "main-test-admin-token-0123" })
    expect(r.code).toBe(1)
    const fatal = r.lines.filter((l) => l.level === "fatal")
    expect(fatal.map((l) => l.msg)).toEqual([
      `engram coordinator: port ${heldPort} on 127.0.0.1 is already in use: another engram process or program listens there. Stop it, or choose another port with ENGRAM_PORT`,
    ])
  })

  it("a database that refuses the connection: one line naming where and ENGRAM_DATABASE_URL, never the password, exit 1", async () => {
    const r = await run({ ENGRAM_PORT: "0", ENGRAM_DATABASE_URL: "postgres://engram:s3cret-pw@127.0.0.1:1/engram", ENGRAM_ADMIN_TOKEN: "main-test-admin-token-0123" })
    expect(r.code).toBe(1)
    const fatal = r.lines.filter((l) => l.level === "fatal")
    expect(fatal.map((l) => l.msg)).toEqual([
      "engram coordinator: the database at 127.0.0.1:1/engram refused the connection (ENGRAM_DATABASE_URL): is PostgreSQL running and listening there?",
    ])
    expect(JSON.stringify(r.lines)).not.toContain("s3cret-pw")
  })

  it("a database with no connection slot left (SQLSTATE 53300): one line naming where, what a replica needs and ENGRAM_STORE_POOL_SIZE, never the password, exit 1", async () => {
    // A real server with 4 slots, 1 reserved for superusers; its slots taken by held connections.
    const server = await startEmbeddedPostgres({ settings: { max_connections: 4, superuser_reserved_connections: 1 } })
    const held: postgres.Sql[] = []
    const hold = async (url: string) => {
      const c = postgres(url, { max: 1, onnotice: () => undefined })
      held.push(c)
      await c`select 1`
    }
    try {
      const base = `127.0.0.1:${server.port}`
      await hold(server.url)
      await held[0]!.unsafe("create role engram_app login password 'app-s3cret-pw'")
      await held[0]!.unsafe("create database engram owner engram_app")
      await hold(server.url)
      await hold(server.url)
      const env = { ENGRAM_PORT: "0", ENGRAM_ADMIN_TOKEN: "main-test-admin-token-0123", ENGRAM_STORE_POOL_SIZE: "6" }
      const needs =
        "each coordinator replica needs 8 connections (ENGRAM_STORE_POOL_SIZE 6 for the store's pool, 1 for the lease, 1 for the change listener): raise max_connections to cover 8 for every one plus the database's other clients, close some of those, or lower ENGRAM_STORE_POOL_SIZE"
      // 3 of 4 taken: the last is a superuser's; an ordinary role is refused.
      const reserved = await run({ ...env, ENGRAM_DATABASE_URL: `postgres://engram_app:app-s3cret-pw@${base}/engram` })
      expect(reserved.code).toBe(1)
      expect(reserved.lines.filter((l) => l.level === "fatal").map((l) => l.msg)).toEqual([
        expect.stringMatching(
          new RegExp(
            `^engram coordinator: the database at ${base.replace(/\./g, "\\.")}/engram has no connection slot left \\(ENGRAM_DATABASE_URL; PostgreSQL said "remaining connection slots are reserved for [^"]+"\\): ${needs.replace(/[()]/g, "\\$&")}$`,
          ),
        ),
      ])
      expect(JSON.stringify(reserved.lines)).not.toContain("app-s3cret-pw")
      // All 4 taken: a superuser too.
      await hold(server.url)
      const full = await run({ ...env, ENGRAM_DATABASE_URL: `postgres://postgres:su-s3cret-pw@${base}/engram` })
      expect(full.code).toBe(1)
      expect(full.lines.filter((l) => l.level === "fatal").map((l) => l.msg)).toEqual([
        `engram coordinator: the database at ${base}/engram has no connection slot left (ENGRAM_DATABASE_URL; PostgreSQL said "sorry, too many clients already"): ${needs}`,
      ])
      expect(JSON.stringify(full.lines)).not.toContain("su-s3cret-pw")
    } finally {
      await Promise.all(held.map((c) => c.end({ timeout: 1 })))
      await server.stop()
    }
  })
})
