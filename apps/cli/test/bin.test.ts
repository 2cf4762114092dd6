// `engram` as a user runs it (bin/engram.js): the services it starts (`engram coordinator`,
// `engram agent`), `pnpm engram` at the repository root (the same bin, without pnpm's echo), an
// unsupported Node.js refused in one line, and a checkout's build kept current with its sources.
import { spawn, spawnSync } from "node:child_process"
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, utimesSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { setTimeout as sleep } from "node:timers/promises"
import { afterAll, describe, expect, it } from "vitest"
import { staleness } from "../bin/fresh.js"
import { appDir, bin, cleanEnv, engram, runCommand } from "./support/Run.js"

const scratch = mkdtempSync(join(tmpdir(), "engram-bin-"))
afterAll(() => rmSync(scratch, { recursive: true, force: true }))

describe("engram coordinator", () => {
  it("runs the coordinator from ENGRAM_* settings; engram status reads it; SIGTERM stops it with 0", async () => {
    const dataDir = join(scratch, "data")
    const child = spawn(process.execPath, [bin, "coordinator"], {
      cwd: scratch,
      env: { ...cleanEnv(), ENGRAM_PORT: "0", ENGRAM_DATA_DIR: dataDir, ENGRAM_LOG_FORMAT: "json" },
      stdio: ["ignore", "pipe", "pipe"],
    })
    let output = ""
    child.stdout.on("data", (b: Buffer) => (output += b.toString()))
    child.stderr.on("data", (b: Buffer) => (output += b.toString()))
    const exited = new Promise<number | null>((r) => child.on("close", (code) => r(code)))
    try {
      // The embedded database starts in ~5 s on an idle machine, a minute or more on a starved one.
      const deadline = Date.now() + 150_000
      while (!/listening on http/.test(output) && child.exitCode === null && Date.now() < deadline) await sleep(100)
      const url = /listening on (http:\/\/[0-9.]+:\d+)/.exec(output)?.[1]
      expect(url, output).toBeDefined()
      const status = await engram(["status"], { env: { ENGRAM_URL: url!, ENGRAM_TOKEN: readFileSync(join(dataDir, "admin-token"), "utf8").trim() } })
      expect(status.code, status.stderr).toBe(0)
      expect(status.stdout).toMatch(/^hosts\s+0 \(0 ready/m)
    } finally {
      child.kill("SIGTERM")
    }
    expect(await exited, output).toBe(0)
  }, 240_000)

  it("--help says what each service reads; an argument is a usage error (exit 2)", async () => {
    const help = await engram(["agent", "--help"])
    expect(help.code).toBe(0)
    expect(help.stdout).toContain("ENGRAM_COORDINATOR_URL")
    expect((await engram(["coordinator", "--help"])).stdout).toContain("ENGRAM_DATABASE_URL")
    const wrong = await engram(["coordinator", "--port", "80"])
    expect(wrong.code).toBe(2)
    expect(wrong.stderr).toBe("engram: coordinator takes no arguments (--port 80): it reads ENGRAM_* variables (engram coordinator --help)\n")
  })
})

describe("pnpm engram at the repository root", () => {
  it("runs the same bin: its output alone, no pnpm command line", async () => {
    const root = resolve(appDir, "..", "..")
    const r = await runCommand("pnpm", ["engram", "--", "--version"], { cwd: root })
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout).toBe("engram v0.1.0\n")
  })
})

const olderNode = "/usr/bin/node"
const olderVersion = existsSync(olderNode) ? spawnSync(olderNode, ["-p", "process.versions.node"], { encoding: "utf8" }).stdout.trim() : ""
const isOlder = olderVersion !== "" && Number(olderVersion.split(".")[0]) < 22

describe.skipIf(!isOlder)(`an unsupported Node.js (${olderNode} ${olderVersion}; skipped where there is none)`, () => {
  it("engram and engram coordinator stop at once with one line naming the version needed", async () => {
    for (const args of [["status"], ["coordinator"]]) {
      const r = await runCommand(olderNode, [bin, ...args], { env: { ENGRAM_DATA_DIR: join(scratch, "never") } })
      expect(r.code).toBe(1)
      expect(r.stdout).toBe("")
      expect(r.stderr).toMatch(new RegExp(`^engram needs Node\\.js 22\\.\\d+ or newer, and this is Node\\.js ${olderVersion.replaceAll(".", "\\.")} \\(${olderNode}\\): install Node\\.js 22 .*\\n$`))
    }
    expect(existsSync(join(scratch, "never"))).toBe(false)
  })
})

describe("a checkout's build", () => {
  it("is current until a source it was built from changes or goes", () => {
    const dir = join(scratch, "fresh")
    mkdirSync(join(dir, "dist"), { recursive: true })
    mkdirSync(join(dir, "src"), { recursive: true })
    expect(staleness(dir)).toBe("no build yet")
    writeFileSync(join(dir, "src/a.ts"), "")
    writeFileSync(join(dir, "dist/main.js"), "")
    writeFileSync(join(dir, "dist/metafile-esm.json"), JSON.stringify({ inputs: { "src/a.ts": {}, "../../node_modules/effect/x.js": {} } }))
    const built = Date.now() / 1000
    utimesSync(join(dir, "src/a.ts"), built - 60, built - 60)
    utimesSync(join(dir, "dist/main.js"), built, built)
    expect(staleness(dir)).toBeNull()
    utimesSync(join(dir, "src/a.ts"), built + 60, built + 60)
    expect(staleness(dir)).toBe("src/a.ts changed")
    rmSync(join(dir, "src/a.ts"))
    expect(staleness(dir)).toBe("src/a.ts is gone")
  })
})
