// The single executable (`pnpm --filter @engram/cli build:sea`): one file, copied out of the
// repository to a directory with no node_modules, runs the command line and both services: a
// coordinator on the embedded PGlite (its migrations, dashboard and WebAssembly from the
// executable's own assets), an agent on the simulated runtime, a session placed and ended.
import { spawn, spawnSync, type ChildProcess } from "node:child_process"
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { setTimeout as sleep } from "node:timers/promises"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { appDir, cleanEnv, runCommand } from "./support/Run.js"

const scratch = mkdtempSync(join(tmpdir(), "engram-sea-"))
const home = join(scratch, "home")
const exe = join(scratch, "bin", "engram")
const children: ChildProcess[] = []

// Node.js builds without the SEA fuse (some distributions' packages) cannot become a single
// executable; the official builds (which `.ci/run` installs) can.
const seaCapable = readFileSync(process.execPath).includes("NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2")

beforeAll(() => {
  if (!seaCapable) return
  const built = spawnSync(process.execPath, ["--import", "tsx", "scripts/build-sea.ts"], { cwd: appDir, encoding: "utf8" })
  if (built.status !== 0) throw new Error(`build-sea failed (${built.status}): ${built.stderr}`)
  mkdirSync(join(scratch, "bin"))
  copyFileSync(join(appDir, "dist-sea", "engram"), exe)
}, 300_000)

afterAll(async () => {
  for (const c of children) c.kill("SIGKILL")
  await sleep(100)
  rmSync(scratch, { recursive: true, force: true })
})

const env = (extra: Record<string, string> = {}) => ({ ...cleanEnv(), HOME: home, XDG_CACHE_HOME: "", ...extra })
const run = (args: readonly string[], extra: Record<string, string> = {}) => runCommand(exe, args, { cwd: scratch, env: env(extra) })

/** Starts a service of the executable; answers its output so far and its exit. */
const service = (name: "coordinator" | "agent", extra: Record<string, string>) => {
  const child = spawn(exe, [name], { cwd: scratch, env: env({ ENGRAM_LOG_FORMAT: "json", ...extra }), stdio: ["ignore", "pipe", "pipe"] })
  children.push(child)
  let output = ""
  child.stdout!.on("data", (b: Buffer) => (output += b.toString()))
  child.stderr!.on("data", (b: Buffer) => (output += b.toString()))
  const exited = new Promise<number | null>((r) => child.on("close", (code) => r(code)))
  const until = async (pattern: RegExp, what: string): Promise<RegExpExecArray> => {
    // The embedded database starts in ~5 s on an idle machine, a minute or more on a starved one.
    const deadline = Date.now() + 150_000
    for (;;) {
      const m = pattern.exec(output)
      if (m !== null) return m
      if (child.exitCode !== null || Date.now() > deadline) {
        if (child.exitCode !== null) await exited
        throw new Error(`${name}: no ${what} (exit ${child.exitCode}): ${output}`)
      }
      await sleep(100)
    }
  }
  return { child, exited, until, output: () => output }
}

describe.skipIf(!seaCapable)("engram as a single executable (this Node.js has the SEA fuse)", () => {
  it("--version and a service's --help answer from the one file", async () => {
    const version = await run(["--version"])
    expect(version.code, version.stderr).toBe(0)
    expect(version.stdout).toBe(`engram v${(JSON.parse(readFileSync(join(appDir, "package.json"), "utf8")) as { version: string }).version}\n`)
    const help = await run(["agent", "--help"])
    expect(help.code).toBe(0)
    expect(help.stdout).toContain("ENGRAM_COORDINATOR_URL")
    expect((await run(["coordinator", "--port", "80"])).code).toBe(2)
  })

  it("a coordinator on PGlite and an agent from the same file: a host added, a session placed, running and ended, the dashboard served", async () => {
    const dataDir = join(scratch, "data")
    const coordinator = service("coordinator", { ENGRAM_PORT: "0", ENGRAM_DATA_DIR: dataDir })
    const url = (await coordinator.until(/listening on (http:\/\/[0-9.]+:\d+)/, "listening line"))[1]!
    const admin = { ENGRAM_URL: url, ENGRAM_TOKEN: readFileSync(join(dataDir, "admin-token"), "utf8").trim() }
    // The assets were written once, under the user's cache directory.
    const cache = join(home, ".cache", "engram")
    expect(readdirSync(cache).filter((d) => d.startsWith("sea-"))).toHaveLength(1)

    const added = await run(["hosts", "add", "sea-h1"], admin)
    expect(added.code, added.stderr).toBe(0)
    const hostToken = added.stdout.split("\n")[0]!.trim()
    const agent = service("agent", {
      ENGRAM_COORDINATOR_URL: url,
      ENGRAM_HOST_ID: "sea-h1",
      ENGRAM_HOST_TOKEN: hostToken,
      ENGRAM_PEER_SECRET: "sea-test-peer-secret-0123456789abcdef",
      ENGRAM_AGENT_PORT: "0",
    })
    await agent.until(/"agent running"/, "running line")

    const created = await run(["sessions", "create", "--id", "sea-s1", "--mem", "512", "--vcpus", "1"], admin)
    expect(created.code, created.stderr).toBe(0)
    // A wait is at most 60 s; a starved machine may need a second one.
    let waited = await run(["sessions", "wait", "sea-s1", "--state", "running", "--timeout", "60s"], admin)
    for (let i = 0; i < 2 && waited.code !== 0; i++) waited = await run(["sessions", "wait", "sea-s1", "--state", "running", "--timeout", "60s"], admin)
    expect(waited.code, waited.stderr + agent.output()).toBe(0)
    const shown = await run(["sessions", "show", "sea-s1"], admin)
    expect(shown.stdout).toMatch(/^host\s+sea-h1$/m)

    const page = await fetch(`${url}/ui`)
    expect(page.status).toBe(200)
    expect(await page.text()).toContain("<!doctype html>")

    const ended = await run(["sessions", "end", "sea-s1"], admin)
    expect(ended.code, ended.stderr).toBe(0)

    agent.child.kill("SIGTERM")
    coordinator.child.kill("SIGTERM")
    expect(await agent.exited, agent.output()).toBe(0)
    expect(await coordinator.exited, coordinator.output()).toBe(0)
    expect(existsSync(join(dataDir, "pglite"))).toBe(true)
  }, 300_000)
})
