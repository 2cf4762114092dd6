// Disk full on the embedded store, for real: the coordinator's data dir on a
// small tmpfs, then the rest of it filled by a file. A write the disk refuses answers 503
// `DiskFull` (JSON, Retry-After, naming the cause) and changes nothing; reads go on; /readyz is
// not ready until a write succeeds again, after room is freed. Mounting needs root (CI runs as
// root); elsewhere the suite is skipped and says why.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { execFileSync } from "node:child_process"
import { closeSync, mkdtempSync, openSync, rmSync, writeSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { call, client } from "./support/http.js"
import type { Answer, Client } from "./support/http.js"

/** Why a tmpfs cannot be mounted here, or null when it can. */
const mountProblem = (): string | null => {
  if (process.platform !== "linux") return "tmpfs mounts need Linux"
  if (process.getuid?.() !== 0) return "mounting a tmpfs needs root (CI runs as root)"
  const probe = mkdtempSync(join(tmpdir(), "engram-diskfull-probe-"))
  try {
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=1m", "tmpfs", probe], { stdio: "ignore" })
    execFileSync("umount", [probe], { stdio: "ignore" })
    return null
  } catch (e) {
    return `mount -t tmpfs failed: ${e instanceof Error ? e.message.split("\n")[0] : String(e)}`
  } finally {
    rmSync(probe, { recursive: true, force: true })
  }
}

const why = mountProblem()
const adminToken = "diskfull-admin-token-0123456789"

let mnt = ""
let c: RunningCoordinator | undefined
let admin: Client
const filler = () => join(mnt, "filler")

/** Fills what is left of the tmpfs with a file. */
const fillDisk = () => {
  const fd = openSync(filler(), "w")
  try {
    for (const size of [1 << 20, 4096, 512]) {
      const chunk = Buffer.alloc(size, 1)
      try {
        for (;;) writeSync(fd, chunk)
      } catch (e) {
        if ((e as { code?: unknown }).code !== "ENOSPC") throw e
      }
    }
  } finally {
    closeSync(fd)
  }
}

describe.skipIf(why !== null)(`disk full on the embedded store${why === null ? "" : ` (skipped: ${why})`}`, () => {
  beforeAll(async () => {
    mnt = mkdtempSync(join(tmpdir(), "engram-diskfull-"))
    // Room for PGlite's files (about 40 MB) and a little more.
    execFileSync("mount", ["-t", "tmpfs", "-o", "size=96m", "tmpfs", mnt])
    c = await startCoordinator({ reaper: false, logLevel: "None", config: { port: 0, dataDir: mnt, adminToken } })
    admin = client(c.url, adminToken)
    expect((await admin.post("/v1/hosts", { id: "h1" })).status).toBe(201)
    expect((await admin.put("/v1/hosts/h1/report", { totalMib: 1 << 22, allocatableMib: 1 << 22, totalVcpus: 1 << 16 })).status).toBe(200)
  })

  afterAll(async () => {
    await c?.stop()
    if (mnt !== "") {
      try {
        execFileSync("umount", [mnt])
      } catch {
        execFileSync("umount", ["-l", mnt])
      }
      rmSync(mnt, { recursive: true, force: true })
    }
  })

  it("a write the full disk refuses is a JSON 503 DiskFull naming the cause and changes nothing; reads go on; /readyz is not ready until a write succeeds after room is freed", async () => {
    expect((await call(c!.url, "GET", "/readyz")).status).toBe(200)
    fillDisk()
    // Writes go on while pages already allocated have room; the first one that needs the disk is refused.
    let refused: { readonly id: string; readonly answer: Answer } | null = null
    const accepted: string[] = []
    for (let i = 0; i < 5000 && refused === null; i++) {
      const id = `s-${i}`
      const a = await admin.post("/v1/sessions", { id, memMib: 1, vcpus: 1, affinity: ["h1"] })
      if (a.status === 201) accepted.push(id)
      else refused = { id, answer: a }
    }
    expect(refused).not.toBeNull()
    const { id: refusedId, answer } = refused!
    expect(answer.status).toBe(503)
    expect(answer.headers.get("content-type")).toContain("application/json")
    expect(Number(answer.headers.get("retry-after"))).toBeGreaterThan(0)
    expect(answer.body).toMatchObject({ error: "DiskFull", retryAfterMs: expect.any(Number) })
    expect(answer.body.message).toMatch(/no space left on device/i)
    // Not ready: a read would succeed, but writes do not.
    const notReady = await call(c!.url, "GET", "/readyz")
    expect(notReady.status).toBe(503)
    expect(notReady.body).toMatchObject({ error: "DiskFull" })
    // Reads go on, and the refused write left nothing.
    expect((await admin.get(`/v1/sessions/${refusedId}`)).status).toBe(404)
    expect((await admin.get("/v1/hosts/h1")).body).toMatchObject({ id: "h1", entries: accepted.length })
    // Room again: still not ready until a write has succeeded.
    rmSync(filler())
    expect((await call(c!.url, "GET", "/readyz")).status).toBe(503)
    expect((await admin.post("/v1/sessions", { id: refusedId, memMib: 1, vcpus: 1, affinity: ["h1"] })).status).toBe(201)
    expect((await call(c!.url, "GET", "/readyz")).status).toBe(200)
    expect((await admin.get("/v1/hosts/h1")).body).toMatchObject({ entries: accepted.length + 1 })
  })
})
