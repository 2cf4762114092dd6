// createDatabase / freshDatabase details: many at once, templates, drop with
// connections still open, and the URL rewriting.
import postgres from "postgres"
import { describe, expect, inject, it } from "vitest"
import { createDatabase, databaseUrl, freshDatabase } from "../src/index.js"

describe("freshDatabase", () => {
  it("creates many databases at once, each distinct", async () => {
    const dbs = await Promise.all(Array.from({ length: 12 }, () => freshDatabase()))
    try {
      expect(new Set(dbs.map((db) => db.name)).size).toBe(dbs.length)
    } finally {
      await Promise.all(dbs.map((db) => db.drop()))
    }
    const sql = postgres(inject("engramTestPgUrl"), { max: 1 })
    const left = await sql`SELECT datname FROM pg_database WHERE datname IN ${sql(dbs.map((db) => db.name))}`
    await sql.end()
    expect(left).toHaveLength(0)
  })

  it("drops a database that still has connections open, once", async () => {
    const db = await freshDatabase({ prefix: "engram_test_dropme" })
    expect(db.name).toMatch(/^engram_test_dropme_[0-9a-f]{12}$/)
    const sql = postgres(db.url, { max: 1, onnotice: () => undefined })
    await sql`SELECT 1`
    await Promise.all([db.drop(), db.drop()])
    await db.drop()
    await sql.end({ timeout: 1 }).catch(() => undefined)
  })

  it("copies a template database", async () => {
    const template = await freshDatabase()
    const seed = postgres(template.url, { max: 1 })
    await seed`CREATE TABLE seeded (id int)`
    await seed`INSERT INTO seeded VALUES (42)`
    await seed.end() // nobody may be connected to a template while it is copied
    const copy = await createDatabase(inject("engramTestPgUrl"), { template: template.name })
    try {
      const sql = postgres(copy.url, { max: 1 })
      expect(await sql`SELECT id FROM seeded`).toEqual([{ id: 42 }])
      await sql.end()
    } finally {
      await copy.drop()
      await template.drop()
    }
  })

  it("rejects a prefix that is not a plain identifier", async () => {
    await expect(freshDatabase({ prefix: 'x"; DROP' })).rejects.toThrow(/bad database name prefix/)
  })
})

describe("databaseUrl", () => {
  it("replaces only the database", () => {
    expect(databaseUrl("postgres://u:p%40ss@db.example:6543/app?sslmode=require", "engram_test_1")).toBe(
      "postgres://u:p%40ss@db.example:6543/engram_test_1?sslmode=require",
    )
    expect(databaseUrl("postgresql://localhost", "x")).toBe("postgresql://localhost/x")
  })
})
