// A transaction of the pool left idle ends by the server's bound even when the store is opened
// without a statement bound (`statementTimeoutMs`, as `StorePg.layer` is by default): a process
// frozen inside a transaction (SIGSTOP, a paused VM) otherwise held its row locks for as long as
// it stayed frozen, and a fenced write holds the lease row, so a frozen leader blocked every
// takeover. The bound is the server's own setting on each connection of the pool, read back here.
import { freshDatabase } from "@engram/test-pg"
import { sql } from "drizzle-orm"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import * as PostgresJs from "../src/PostgresJs.js"

const settingOf = (options: Omit<PostgresJs.ConnectOptions, "url">) =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const database = yield* Effect.promise(() => freshDatabase())
        const db = yield* PostgresJs.open({ url: database.url, poolSize: 1, migrate: false, ...options })
        const rows = yield* db.pool.query<{ setting: string }>(sql`select setting from pg_settings where name = 'idle_in_transaction_session_timeout'`)
        return Number(rows[0]?.setting)
      }),
    ),
  )

describe("the pool's bound on a transaction left idle", () => {
  it("is a minute without a statement bound, and the statement bound where one is given", async () => {
    expect(await settingOf({})).toBe(60_000)
    expect(PostgresJs.defaultIdleInTransactionMs).toBe(60_000)
    expect(await settingOf({ statementTimeoutMs: 15_000 })).toBe(15_000)
  })
})
