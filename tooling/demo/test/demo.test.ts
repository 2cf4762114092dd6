/**
 * The demo as `pnpm start` runs it (a child process, `src/demo.ts`) beside a coordinator whose
 * data dir is `<root>/.engram`, with INIT_CWD = <root> as pnpm sets it at the repository root:
 * the demo finds the admin token there, keeps its own state there, tells the tour as a
 * numbered story and closes with the CLI commands and the dashboard's address, and its output
 * (verbose: every agent line too) holds none of the secrets it used (admin token, host tokens,
 * peer secret, the status and move tokens derived from it, or a token's hash).
 */
import { type ChildProcess, spawn } from "node:child_process"
import { createHash } from "node:crypto"
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { setTimeout as sleep } from "node:timers/promises"
import { pathToFileURL } from "node:url"
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { Limits } from "@engram/core"
import { MoveToken } from "@engram/host-agent"
import { afterAll, describe, expect, it } from "vitest"
import { runQemuTests } from "@engram/guest"

const pkgDir = resolve(import.meta.dirname, "..")
const root = mkdtempSync(join(tmpdir(), "engram-demo-root-"))
let coordinator: RunningCoordinator | undefined
let demo: ChildProcess | undefined

afterAll(async () => {
  if (demo !== undefined && demo.exitCode === null && demo.signalCode === null) {
    const exited = new Promise((r) => demo!.once("exit", r))
    demo.kill("SIGTERM")
    await Promise.race([exited, sleep(5000).then(() => demo!.kill("SIGKILL"))])
  }
  await coordinator?.stop()
  rmSync(root, { recursive: true, force: true })
}, 60_000)

const sha256 = (s: string) => createHash("sha256").update(s, "utf8").digest("hex")

describe("the demo (pnpm start)", () => {
  it("finds the admin token in <INIT_CWD>/.engram, keeps its state there, runs the tour, and prints no secret", async () => {
    const dataDir = join(root, ".engram")
    coordinator = await startCoordinator({
      config: { port: 0, dataDir, limits: { ...Limits.defaults, reaperIntervalMs: 250 } },
      logLevel: "Warn",
    })
    expect(coordinator.adminTokenFile).toBe(join(dataDir, "admin-token"))

    const env: Record<string, string | undefined> = { ...process.env }
    for (const k of ["ENGRAM_ADMIN_TOKEN", "ENGRAM_ADMIN_TOKEN_FILE", "ENGRAM_DATA_DIR", "ENGRAM_DEMO_STATE_DIR", "ENGRAM_DEMO_TOUR", "ENGRAM_PORT"]) delete env[k]
    const output: string[] = []
    const loader = pathToFileURL(join(pkgDir, "node_modules/tsx/dist/loader.mjs")).href
    demo = spawn(process.execPath, ["--import", loader, "--conditions=@engram/source", join(pkgDir, "src/demo.ts")], {
      cwd: pkgDir,
      env: { ...env, INIT_CWD: root, ENGRAM_COORDINATOR_URL: coordinator.url, NO_COLOR: "1", ENGRAM_LOG_FORMAT: "pretty", ENGRAM_TOUR_VERBOSE: "1" },
      stdio: ["ignore", "pipe", "pipe"],
    })
    const onData = (b: Buffer) => void output.push(b.toString())
    demo.stdout?.on("data", onData)
    demo.stderr?.on("data", onData)
    const deadline = Date.now() + 150_000
    const closing = "Ctrl-C stops the coordinator and the agents."
    while (!output.join("").includes(closing) && Date.now() < deadline && demo.exitCode === null) await sleep(250)
    const text = output.join("")
    expect(text, text).toContain(closing)
    expect(text).not.toMatch(/the tour stopped/)
    // The story, in order: place, park, queue and descend, move, refuse, end.
    const story = [
      "The tour: two simulated hosts, sim-host-1 (8 GiB, 8 vCPUs) and sim-host-2 (4 GiB, 4 vCPUs).",
      "  1. A session of 1 GiB is created: placed on sim-host-2, where its agent starts the VM (running).",
      "  2. It goes idle. Nothing waits for room, so it parks: paused in RAM, keeping its room, ready to resume in milliseconds.",
      "  3. sim-host-1 is cordoned and sim-host-2 filled; a new 1 GiB session finds no room and queues (sim-host-1 cordoned, sim-host-2 ram_full).",
      "     The park yields: session a descended (captured to disk, room released), and the queued session runs on sim-host-2.",
      "  4. It moves live to sim-host-1 ", // within its budget, or over it on a loaded machine (said as measured)
      "  5. Moving it back within 300 ms is refused before the guest pauses (estimate ",
      "  6. The tour ends its sessions.",
      "  pnpm engram -- status                           the fleet signal",
      `  dashboard      ${coordinator.url}/ui   (sign in with the token in .engram/admin-token)`,
    ]
    let at = -1
    for (const line of story) {
      const next = text.indexOf(line, at + 1)
      expect(next, `"${line}" after the previous line of the story:\n${text}`).toBeGreaterThan(at)
      at = next
    }

    // Its state sits beside the coordinator's, in files only its owner can read.
    const stateDir = join(dataDir, "demo")
    const hostTokens = JSON.parse(readFileSync(join(stateDir, "hosts.json"), "utf8")) as Record<string, string>
    const peerSecret = readFileSync(join(stateDir, "peer-secret"), "utf8").trim()
    const adminToken = readFileSync(join(dataDir, "admin-token"), "utf8").trim()
    expect(Object.keys(hostTokens).sort()).toEqual(["sim-host-1", "sim-host-2"])
    for (const f of ["hosts.json", "peer-secret", "sim-host-1.status-token", "sim-host-2.status-token"]) {
      expect(statSync(join(stateDir, f)).mode & 0o777, f).toBe(0o600)
    }
    // The printed commands read the secrets from those files.
    expect(text).toContain("$(cat .engram/admin-token)")
    expect(text).toContain(`$(cat ${join(stateDir, "sim-host-1.status-token")})`)

    const secrets: Record<string, string> = { adminToken, peerSecret, adminTokenHash: sha256(adminToken) }
    for (const [id, token] of Object.entries(hostTokens)) {
      secrets[`hostToken ${id}`] = token
      secrets[`hostTokenHash ${id}`] = sha256(token)
      secrets[`statusToken ${id}`] = MoveToken.statusToken(peerSecret, id)
    }
    for (const [name, value] of Object.entries(secrets)) {
      expect(value.length, name).toBeGreaterThanOrEqual(16)
      expect(text.includes(value), `${name} appears in the demo's output`).toBe(false)
    }
    // Move tokens (HMAC hex) and any other 64-hex or 43-char base64url credential: none at all.
    expect(text.match(/\b[0-9a-f]{64}\b/g) ?? []).toEqual([])
    expect(text.match(/(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])/g) ?? []).toEqual([])
  }, 240_000)
})

/** Polls `f` until `ok` holds, or fails after `timeoutMs`. */
const until = async <A>(what: string, f: () => Promise<A>, ok: (a: A) => boolean, timeoutMs: number): Promise<A> => {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const a = await f()
    if (ok(a)) return a
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms (last: ${JSON.stringify(a)})`)
    await sleep(250)
  }
}

/** The live QEMU processes whose command line names `dir` (read from /proc: what really runs). */
const qemuProcesses = (dir: string): { readonly pid: number; readonly vmName: string }[] =>
  readdirSync("/proc")
    .filter((e) => /^\d+$/.test(e))
    .flatMap((e) => {
      try {
        const argv = readFileSync(`/proc/${e}/cmdline`, "utf8").split("\0")
        const stat = readFileSync(`/proc/${e}/stat`, "utf8")
        const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3)
        if (!(argv[0] ?? "").includes("qemu-system") || !argv.some((a) => a.includes(dir)) || state === "Z") return []
        return [{ pid: Number(e), vmName: (argv[argv.indexOf("-name") + 1] ?? "").replace(/^engram-/, "") }]
      } catch {
        return []
      }
    })

describe.skipIf(!runQemuTests)("the demo on real guests (ENGRAM_RUNTIME=qemu pnpm start; needs qemu-system-x86_64: CI installs it)", () => {
  it("stopped as Ctrl-C stops it (SIGINT, then the launcher's SIGTERM), it ends its guests: no QEMU is left", async () => {
    const qemuRoot = mkdtempSync(join(tmpdir(), "engram-demo-qemu-"))
    const dataDir = join(qemuRoot, ".engram")
    const own = await startCoordinator({ config: { port: 0, dataDir, limits: { ...Limits.defaults, reaperIntervalMs: 250 } }, logLevel: "Warn" })
    const env: Record<string, string | undefined> = { ...process.env }
    for (const k of ["ENGRAM_ADMIN_TOKEN", "ENGRAM_ADMIN_TOKEN_FILE", "ENGRAM_DATA_DIR", "ENGRAM_DEMO_STATE_DIR", "ENGRAM_PORT"]) delete env[k]
    const loader = pathToFileURL(join(pkgDir, "node_modules/tsx/dist/loader.mjs")).href
    const output: string[] = []
    const child = spawn(process.execPath, ["--import", loader, "--conditions=@engram/source", join(pkgDir, "src/demo.ts")], {
      cwd: pkgDir,
      env: { ...env, INIT_CWD: qemuRoot, ENGRAM_COORDINATOR_URL: own.url, ENGRAM_RUNTIME: "qemu", ENGRAM_DEMO_TOUR: "0", NO_COLOR: "1", ENGRAM_LOG_FORMAT: "pretty" },
      stdio: ["ignore", "pipe", "pipe"],
    })
    child.stdout?.on("data", (b: Buffer) => void output.push(b.toString()))
    child.stderr?.on("data", (b: Buffer) => void output.push(b.toString()))
    const stateDir = join(dataDir, "demo")
    try {
      await until("the demo is ready", async () => output.join(""), (t) => t.includes("Ctrl-C stops the coordinator and the agents.") || child.exitCode !== null, 180_000)
      const headers = { authorization: `Bearer ${readFileSync(join(dataDir, "admin-token"), "utf8").trim()}`, "content-type": "application/json" }
      const created = await fetch(`${own.url}/v1/sessions`, { method: "POST", headers, body: JSON.stringify({ id: "g1", memMib: 128, vcpus: 1 }) })
      expect(created.status).toBe(201)
      await until("g1 runs a real guest", async () => ((await (await fetch(`${own.url}/v1/sessions/g1`, { headers })).json()) as { state: string }).state, (st) => st === "running", 180_000)
      expect(qemuProcesses(stateDir).map((p) => p.vmName)).toEqual(["g1"])
      const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)))
      child.kill("SIGINT")
      await sleep(100)
      if (child.exitCode === null) child.kill("SIGTERM")
      expect(await exited, output.join("")).toBe(0)
      expect(qemuProcesses(stateDir), "QEMU processes of the demo left after it stopped").toEqual([])
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL")
      for (const p of qemuProcesses(stateDir)) process.kill(p.pid, "SIGKILL")
      await own.stop()
      rmSync(qemuRoot, { recursive: true, force: true })
    }
  }, 420_000)
})
