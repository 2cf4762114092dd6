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
const dataDir = mkdtempSync(join(tmpdir(), "engram-start-"))
afterAll(() => rmSync(dataDir, { recursive: true, force: true }))

describe("pnpm start", () => {
  it("starts the coordinator and the demo, and Ctrl-C ends everything with exit 0 and no ELIFECYCLE", async () => {
    const env: Record<string, string | undefined> = { ...process.env }
    for (const k of Object.keys(env)) if (k.startsWith("ENGRAM_")) delete env[k]
    const child = spawn("pnpm", ["start"], {
      cwd: root,
      // Its own process group, so the test can signal the group as a terminal's Ctrl-C does.
      detached: true,
      env: { ...env, ENGRAM_DATA_DIR: dataDir, ENGRAM_PORT: "0", ENGRAM_DEMO_TOUR: "0", ENGRAM_LOG_FORMAT: "pretty", NO_COLOR: "1" },
      stdio: ["ignore", "pipe", "pipe"],
    })
    let output = ""
    child.stdout.on("data", (b: Buffer) => (output += b.toString()))
    child.stderr.on("data", (b: Buffer) => (output += b.toString()))
    const exited = new Promise<number | null>((r) => child.on("close", (code) => r(code)))
    const closing = "Ctrl-C stops the coordinator and the agents."
    const deadline = Date.now() + 150_000
    while (!output.includes(closing) && child.exitCode === null && Date.now() < deadline) await sleep(250)
    expect(output, output).toContain(closing)
    expect(output).toMatch(/dashboard {6}http:\/\/127\.0\.0\.1:\d+\/ui/)

    process.kill(-(child.pid as number), "SIGINT")
    expect(await exited, output).toBe(0)
    expect(output).not.toContain("ELIFECYCLE")
    expect(output).not.toMatch(/\b(FATAL|ERROR)\b/)
  }, 240_000)
})

const olderNode = "/usr/bin/node"
const olderVersion = existsSync(olderNode) ? spawnSync(olderNode, ["-p", "process.versions.node"], { encoding: "utf8" }).stdout.trim() : ""
const isOlder = olderVersion !== "" && Number(olderVersion.split(".")[0]) < 22

describe.skipIf(!isOlder)(`pnpm start on an unsupported Node.js (${olderNode} ${olderVersion} first on PATH; skipped where there is none)`, () => {
  it("stops at once with one line naming the version needed, instead of waiting for a coordinator that never comes", async () => {
    const env: Record<string, string | undefined> = { ...process.env }
    for (const k of Object.keys(env)) if (k.startsWith("ENGRAM_")) delete env[k]
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

