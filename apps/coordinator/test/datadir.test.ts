// `pnpm start` at the repository root: pnpm runs the coordinator in apps/coordinator with
// INIT_CWD = the root, and the state (PGlite, the generated admin token) belongs in the root's
// .engram/. The process's output names the token file and never the token itself.
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { startChild } from "./support/child.js"
import type { ChildCoordinator } from "./support/child.js"
import { client } from "./support/http.js"

const root = mkdtempSync(join(tmpdir(), "engram-initcwd-"))
let child: ChildCoordinator | undefined
afterAll(async () => {
  if (child !== undefined && child.process.exitCode === null) {
    child.process.kill("SIGTERM")
    await child.exited
  }
  rmSync(root, { recursive: true, force: true })
})

describe("the data dir under pnpm", () => {
  it("a relative ENGRAM_DATA_DIR (default ./.engram) is resolved against INIT_CWD; the admin token is written there, 0600, and never printed", async () => {
    child = await startChild({ INIT_CWD: root, ENGRAM_DATA_DIR: "", ENGRAM_ADMIN_TOKEN: "", ENGRAM_DATABASE_URL: "", ENGRAM_CONFIG_FILE: "" })
    const tokenFile = join(root, ".engram", "admin-token")
    expect(existsSync(tokenFile)).toBe(true)
    expect(statSync(tokenFile).mode & 0o777).toBe(0o600)
    expect(existsSync(join(root, ".engram", "pglite"))).toBe(true)
    const token = readFileSync(tokenFile, "utf8").trim()
    expect((await client(child.url, token).get("/v1/hosts")).status).toBe(200)
    // A host's token is answered once, to its caller, and never logged either.
    const host = await client(child.url, token).post("/v1/hosts", { id: "initcwd-h" })
    expect(host.status).toBe(201)
    child.process.kill("SIGTERM")
    expect(await child.exited).toBe(0)
    const out = child.output()
    expect(out).toContain(tokenFile)
    // A stop by signal ends with one closing line, after the finalizers.
    expect(out).toMatch(/engram coordinator stopped/)
    expect(out).not.toContain(token)
    expect(out).not.toContain(host.body.token as string)
  })
})
