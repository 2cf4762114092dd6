// `pnpm start` at the repository root, as a newcomer runs it: one launcher starts the
// coordinator and the demo fleet; Ctrl-C (SIGINT to the whole process group, as a terminal
// sends it) stops both and the command ends with exit 0 and no package-manager noise.
import { spawn, spawnSync } from "node:child_process"
import { existsSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join, resolve } from "node:path"
import { setTimeout as sleep } from "node:timers/promises"
import { afterAll, describe, expect, it } from "vitest"

const root = resolve(import.meta.dirname, "..", "..", "..")
const dataDirs: string[] = []
const groups: number[] = []
afterAll(() => {
  // A case that failed before its Ctrl-C: end what it started (the coordinator follows its launcher).
  for (const g of groups) {
    try {
      process.kill(-g, "SIGKILL")
    } catch {
      // already gone
    }
  }
  for (const d of dataDirs) rmSync(d, { recursive: true, force: true })
})

const closing = "Ctrl-C ends the sessions on the demo hosts and stops the coordinator and the agents."

/** A fresh data dir (removed after the file) and this process's environment without its ENGRAM_* settings. */
const fresh = () => {
  const dataDir = mkdtempSync(join(tmpdir(), "engram-start-"))
  dataDirs.push(dataDir)
  const env: Record<string, string | undefined> = { ...process.env }
  for (const k of Object.keys(env)) if (k.startsWith("ENGRAM_")) delete env[k]
  return { dataDir, env }
}

/** `pnpm start` in a process group of its own (so the test can signal the group as a terminal does), up to the demo's closing lines. */
const start = async () => {
  const { dataDir, env } = fresh()
  const child = spawn("pnpm", ["start"], {
    cwd: root,
    detached: true,
    env: { ...env, ENGRAM_DATA_DIR: dataDir, ENGRAM_PORT: "0", ENGRAM_DEMO_TOUR: "0", ENGRAM_LOG_FORMAT: "pretty", NO_COLOR: "1" },
    stdio: ["ignore", "pipe", "pipe"],
  })
  groups.push(child.pid as number)
  const out = { text: "" }
  child.stdout.on("data", (b: Buffer) => (out.text += b.toString()))
  child.stderr.on("data", (b: Buffer) => (out.text += b.toString()))
  const exited = new Promise<number | null>((r) => child.on("close", (code) => r(code)))
  // CI's machine took 62-88 s to get here (a third of this run's share of a loaded 2-core machine).
  const deadline = Date.now() + 300_000
  while (!out.text.includes(closing) && child.exitCode === null && Date.now() < deadline) await sleep(250)
  expect(out.text, out.text).toContain(closing)
  const url = /dashboard {6}(http:\/\/127\.0\.0\.1:\d+)\/ui/.exec(out.text)?.[1]
  expect(url, out.text).toBeDefined()
  return { group: child.pid as number, out, exited, url: url as string }
}

/** Whether the coordinator still answers, after at most `ms`. */
const answersAfter = async (url: string, ms: number) => {
  const deadline = Date.now() + ms
  for (;;) {
    const up = await fetch(`${url}/livez`).then(
      (r) => r.ok,
      () => false,
    )
    if (!up || Date.now() > deadline) return up
    await sleep(250)
  }
}

describe("pnpm start", () => {
  it("starts the coordinator and the demo, and Ctrl-C ends everything with exit 0 and no ELIFECYCLE", async () => {
    const s = await start()
    expect(await answersAfter(s.url, 0)).toBe(true)
    process.kill(-s.group, "SIGINT")
    expect(await s.exited, s.out.text).toBe(0)
    expect(s.out.text).not.toContain("ELIFECYCLE")
    expect(s.out.text).not.toMatch(/\b(FATAL|ERROR)\b/)
    // The coordinator (in a process group of its own) is stopped too.
    expect(await answersAfter(s.url, 0)).toBe(false)
  }, 420_000)

  it("a launcher killed outright takes its coordinator with it", async () => {
    const s = await start()
    process.kill(-s.group, "SIGKILL")
    await s.exited
    expect(await answersAfter(s.url, 30_000)).toBe(false)
  }, 420_000)
})

const olderNode = "/usr/bin/node"
const olderVersion = existsSync(olderNode) ? spawnSync(olderNode, ["-p", "process.versions.node"], { encoding: "utf8" }).stdout.trim() : ""
const isOlder = olderVersion !== "" && Number(olderVersion.split(".")[0]) < 22

describe.skipIf(!isOlder)(`pnpm start on an unsupported Node.js (${olderNode} ${olderVersion} first on PATH; skipped where there is none)`, () => {
  it("stops at once with one line naming the version needed, instead of waiting for a coordinator that never comes", async () => {
    const { dataDir, env } = fresh()
    const child = spawn("pnpm", ["start"], {
      cwd: root,
      env: { ...env, PATH: `${dirname(olderNode)}:${env["PATH"] ?? ""}`, ENGRAM_DATA_DIR: join(dataDir, "old-node"), ENGRAM_PORT: "0", NO_COLOR: "1" },
      stdio: ["ignore", "pipe", "pipe"],
    })
    let output = ""
    child.stdout.on("data", (b: Buffer) => (output += b.toString()))
    child.stderr.on("data", (b: Buffer) => (output += b.toString()))
    const code = await new Promise<number | null>((r) => child.on("close", (c) => r(c)))
    expect(code, output).not.toBe(0)
    expect(output).toContain(`engram needs Node.js 22.19 or newer, and this is Node.js ${olderVersion} (${olderNode})`)
    expect(output).not.toContain("waiting for the coordinator")
    expect(existsSync(join(dataDir, "old-node"))).toBe(false)
  }, 60_000)
})

