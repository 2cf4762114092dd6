// The coordinator's process (`src/main.ts`, as operators run it) when it cannot start: a port
// in use and a database that refuses are each one line naming the setting, and exit 1.
import { createServer } from "node:net"
import type { Server } from "node:net"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
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
})
