// The coordinator's process (`src/main.ts`, as operators run it) when it cannot start: a port
// in use and a database that refuses are each one line naming the setting, and exit 1.
import { createServer } from "node:net"
import type { Server } from "node:net"
import { spawn } from "node:child_process"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { afterAll, beforeAll, describe, expect, it } from "vitest"

const appDir = join(dirname(fileURLToPath(import.meta.url)), "..")
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

/** Runs the coordinator to its end; answers its exit code and its JSON log lines. */
const run = (env: Record<string, string>): Promise<{ code: number | null; lines: { level: string; msg: string }[] }> =>
  new Promise((resolve) => {
    const clean = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("ENGRAM_")))
    const child = spawn(process.execPath, ["--import", "tsx", "--conditions=@engram/source", "src/main.ts"], {
      cwd: appDir,
      env: { ...clean, ENGRAM_LOG_FORMAT: "json", ENGRAM_DATA_DIR: dataDir, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    })
    let out = ""
    child.stdout.on("data", (b: Buffer) => (out += b.toString()))
    child.stderr.on("data", (b: Buffer) => (out += b.toString()))
    child.on("close", (code) =>
      resolve({
        code,
        lines: out
          .trim()
          .split("\n")
          .filter((l) => l.startsWith("{"))
          .map((l) => JSON.parse(l) as { level: string; msg: string }),
      }),
    )
  })

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
