// The end-to-end suite on the embedded default (PGlite in a data dir), and restart persistence.
import { startCoordinator } from "@engram/coordinator"
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { client } from "./support/http.js"
import { apiSuite } from "./suite.js"

const dirs: string[] = []
const freshDir = () => {
  const d = mkdtempSync(join(tmpdir(), "engram-coordinator-pglite-"))
  dirs.push(d)
  return d
}
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true })
})

apiSuite("PGlite", {
  coordinator: async (o) => ({
    reaper: false,
    logLevel: "Warn",
    // The suite drives passes by hand right after start: no failover grace (grace.test.ts has its own).
    config: { port: 0, dataDir: freshDir(), reclaimGraceMs: 0, ...(o?.moveTimeoutMs === undefined ? {} : { moveTimeoutMs: o.moveTimeoutMs }) },
  }),
})

describe("the embedded default survives a restart", () => {
  it("hosts and sessions are still there after stop and start on the same data dir; the admin token file is 0600", async () => {
    const dataDir = freshDir()
    const first = await startCoordinator({ logLevel: "Warn", config: { port: 0, dataDir } })
    const tokenFile = join(dataDir, "admin-token")
    expect(first.adminTokenFile).toBe(tokenFile)
    expect(existsSync(tokenFile)).toBe(true)
    expect(statSync(tokenFile).mode & 0o777).toBe(0o600)
    expect(readFileSync(tokenFile, "utf8").trim()).toBe(first.adminToken)
    const admin = client(first.url, first.adminToken)
    const host = await admin.post("/v1/hosts", { id: "keep-h" })
    await admin.put("/v1/hosts/keep-h/report", { totalMib: 8192, allocatableMib: 5120, totalVcpus: 4 })
    expect((await admin.post("/v1/sessions", { id: "keep-s", memMib: 512, vcpus: 1 })).status).toBe(201)
    await first.stop()

    const second = await startCoordinator({ logLevel: "Warn", config: { port: 0, dataDir } })
    try {
      expect(second.adminToken).toBe(first.adminToken)
      const again = client(second.url, second.adminToken)
      expect((await again.get("/v1/hosts/keep-h")).body).toMatchObject({ id: "keep-h", measured: true, allocatableMib: 4096, reservedMib: 512 })
      expect((await again.get("/v1/sessions/keep-s")).body).toMatchObject({ state: "pending", hostId: "keep-h" })
      // The host's token still acts for it (only its hash was stored).
      expect((await client(second.url, host.body.token).get("/v1/hosts/keep-h/assignments")).status).toBe(200)
    } finally {
      await second.stop()
    }
  })
})
