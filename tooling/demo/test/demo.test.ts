/**
 * The demo as `pnpm start` runs it (a child process, `src/demo.ts`) beside a coordinator whose
 * data dir is `<root>/.engram`, with INIT_CWD = <root> as pnpm sets it at the repository root:
 * the demo finds the admin token there, keeps its own state there, tells the tour as a
 * numbered story (with why hosts offer less RAM and more vCPUs than they have) and closes with
 * the CLI commands and the dashboard's address; its output (verbose: every agent line too)
 * holds none of the secrets it used (admin token, host tokens, peer secret, the status and
 * move tokens derived from it, or a token's hash). Ctrl-C ends the sessions that hold room on
 * its hosts. Started again on a fleet in use, it leaves that fleet alone.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { createHash } from "node:crypto"
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs"
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
const dataDir = join(root, ".engram")
const stateDir = join(dataDir, "demo")
let coordinator: RunningCoordinator | undefined
const demos: ChildProcess[] = []

const stopDemo = async (demo: ChildProcess, signal: NodeJS.Signals = "SIGTERM") => {
  if (demo.exitCode !== null || demo.signalCode !== null) return
  const exited = new Promise((r) => demo.once("exit", r))
  demo.kill(signal)
  await Promise.race([exited, sleep(20_000).then(() => demo.kill("SIGKILL"))])
}

afterAll(async () => {
  for (const d of demos) await stopDemo(d)
  await coordinator?.stop()
  rmSync(root, { recursive: true, force: true })
}, 60_000)

const sha256 = (s: string) => createHash("sha256").update(s, "utf8").digest("hex")
const closing = "Ctrl-C ends the sessions on the demo hosts and stops the coordinator and the agents."

/** The demo as a child process, its output collected. */
const startDemo = (extra: Record<string, string> = {}) => {
  const env: Record<string, string | undefined> = { ...process.env }
  for (const k of ["ENGRAM_ADMIN_TOKEN", "ENGRAM_ADMIN_TOKEN_FILE", "ENGRAM_DATA_DIR", "ENGRAM_DEMO_STATE_DIR", "ENGRAM_DEMO_TOUR", "ENGRAM_PORT"]) delete env[k]
  const output: string[] = []
  const loader = pathToFileURL(join(pkgDir, "node_modules/tsx/dist/loader.mjs")).href
  const demo = spawn(process.execPath, ["--import", loader, "--conditions=@engram/source", join(pkgDir, "src/demo.ts")], {
    cwd: pkgDir,
    env: { ...env, INIT_CWD: root, ENGRAM_COORDINATOR_URL: coordinator!.url, NO_COLOR: "1", ENGRAM_LOG_FORMAT: "pretty", ENGRAM_TOUR_VERBOSE: "1", ...extra },
    stdio: ["ignore", "pipe", "pipe"],
  })
  demos.push(demo)
  const onData = (b: Buffer) => void output.push(b.toString())
  demo.stdout?.on("data", onData)
  demo.stderr?.on("data", onData)
  const text = () => output.join("")
  /** Waits until the output holds `line` (or the demo exits, or 150 s pass). */
  const until = async (line: string) => {
    const deadline = Date.now() + 150_000
    while (!text().includes(line) && Date.now() < deadline && demo.exitCode === null) await sleep(250)
    expect(text(), text()).toContain(line)
  }
  return { demo, text, until }
}

/** The admin's API, with the token the coordinator wrote. */
const admin = async (method: string, path: string, body?: unknown) => {
  const token = readFileSync(join(dataDir, "admin-token"), "utf8").trim()
  const res = await fetch(`${coordinator!.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })
  return { status: res.status, body: (await res.json()) as { state?: string; [k: string]: unknown } }
}
const stateOf = async (id: string) => (await admin("GET", `/v1/sessions/${id}`)).body.state
const waitState = async (id: string, state: string) => {
  for (let i = 0; i < 200 && (await stateOf(id)) !== state; i++) await sleep(100)
  expect(await stateOf(id)).toBe(state)
}

describe("the demo (pnpm start)", () => {
  it("finds the admin token in <INIT_CWD>/.engram, keeps its state there, runs the tour, prints no secret, and ends its sessions on Ctrl-C", async () => {
    coordinator = await startCoordinator({
      config: { port: 0, dataDir, limits: { ...Limits.defaults, reaperIntervalMs: 250 } },
      logLevel: "Warn",
    })
    expect(coordinator.adminTokenFile).toBe(join(dataDir, "admin-token"))

    const run = startDemo()
    await run.until(closing)
    const text = run.text()
    expect(text).not.toMatch(/the tour stopped/)
    // The story, in order: the hosts' room explained, place, park, queue and descend, move, refuse, end.
    const story = [
      "The tour: two simulated hosts, sim-host-1 (8 GiB, 8 vCPUs) and sim-host-2 (4 GiB, 4 vCPUs).",
      "   Reserve: of sim-host-1's 8 GiB, its OS uses 0.5 GiB and the coordinator keeps 1 GiB for the host itself (ENGRAM_SYSTEM_RESERVE_MIB), so sessions get 6.5 GiB.",
      "   Overcommit: sessions rarely keep every vCPU busy, so each core counts 4 times (ENGRAM_CPU_OVERCOMMIT): its 8 cores offer 32 vCPUs. RAM is not overcommitted.",
      "  1. A session of 1 GiB is created from the template demo-1g: placed on sim-host-2, where its agent starts the VM from that booted, paused guest instead of booting one (running).",
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
    // The tour's sessions start from the agents' template, as their own lines say (ENGRAM_TOUR_VERBOSE=1).
    expect(text, text).toMatch(/started {2}.*sessionId=tour-[0-9a-z]+-a .*from=template .*template=demo-1g /)
    expect(text, text).toMatch(/started {2}.*sessionId=tour-[0-9a-z]+-c .*from=template /)
    // The figures of the reserve line are the coordinator's own.
    const host = (await admin("GET", "/v1/hosts/sim-host-1")).body
    expect(host).toMatchObject({ allocatableMib: 6656, reportedAllocatableMib: 7680, cpuBudget: 32 })

    // Its state sits beside the coordinator's, in files only its owner can read.
    const hostTokens = JSON.parse(readFileSync(join(stateDir, "hosts.json"), "utf8")) as Record<string, string>
    const peerSecret = readFileSync(join(stateDir, "peer-secret"), "utf8").trim()
    const adminToken = readFileSync(join(dataDir, "admin-token"), "utf8").trim()
    expect(Object.keys(hostTokens).sort()).toEqual(["sim-host-1", "sim-host-2"])
    for (const f of ["hosts.json", "peer-secret", "sim-host-1.status-token", "sim-host-2.status-token"]) {
      expect(statSync(join(stateDir, f)).mode & 0o777, f).toBe(0o600)
    }
    expect(existsSync(join(stateDir, "toured"))).toBe(true)
    // The printed commands read the secrets from those files.
    expect(text).toContain("$(cat .engram/admin-token)")
    expect(text).toContain(`$(cat ${join(stateDir, "sim-host-1.status-token")})`)

    // A user's sessions on the demo hosts: one running, one parked, and one that never placed.
    expect((await admin("POST", "/v1/sessions", { id: "mine-running", memMib: 512, vcpus: 1, affinity: ["sim-host-1"] })).status).toBe(201)
    expect((await admin("POST", "/v1/sessions", { id: "mine-parked", memMib: 512, vcpus: 1, affinity: ["sim-host-2"] })).status).toBe(201)
    await waitState("mine-running", "running")
    await waitState("mine-parked", "running")
    expect((await admin("POST", "/v1/sessions/mine-parked/idle")).body.state).toBe("parked")
    expect((await admin("POST", "/v1/sessions", { id: "mine-queued", memMib: 64 * 1024, vcpus: 1 })).status).toBe(202)

    // Ctrl-C (the terminal's SIGINT): both end at once, instead of turning lost once their reservations go stale.
    await stopDemo(run.demo, "SIGINT")
    expect(run.demo.exitCode, run.text()).toBe(0)
    expect(run.text()).toContain("Stopping: ended 2 sessions on the demo hosts (mine-running, mine-parked); their VMs stop with the agents.")
    expect(await stateOf("mine-running")).toBe("ended")
    expect(await stateOf("mine-parked")).toBe("ended")
    expect(await stateOf("mine-queued")).toBe("queued")
    await admin("DELETE", "/v1/sessions/mine-queued")

    const secrets: Record<string, string> = { adminToken, peerSecret, adminTokenHash: sha256(adminToken) }
    for (const [id, token] of Object.entries(hostTokens)) {
      secrets[`hostToken ${id}`] = token
      secrets[`hostTokenHash ${id}`] = sha256(token)
      secrets[`statusToken ${id}`] = MoveToken.statusToken(peerSecret, id)
    }
    const all = run.text()
    for (const [name, value] of Object.entries(secrets)) {
      expect(value.length, name).toBeGreaterThanOrEqual(16)
      expect(all.includes(value), `${name} appears in the demo's output`).toBe(false)
    }
    // Move tokens (HMAC hex) and any other 64-hex or 43-char base64url credential: none at all.
    expect(all.match(/\b[0-9a-f]{64}\b/g) ?? []).toEqual([])
    expect(all.match(/(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])/g) ?? []).toEqual([])
  }, 600_000)

  it("started again on a fleet in use, it does not tour it: a parked session stays parked", async () => {
    // A session parked on a demo host while no demo runs (as an operator would leave one).
    expect((await admin("POST", "/v1/sessions", { id: "kept", memMib: 1024, vcpus: 1, affinity: ["sim-host-2"] })).status).toBe(201)
    expect((await admin("POST", "/v1/sessions/kept/started")).body.state).toBe("running")
    expect((await admin("POST", "/v1/sessions/kept/idle")).body.state).toBe("parked")

    // Asked to tour again (ENGRAM_DEMO_TOUR=1): the fleet is not the demo's to tour.
    const again = startDemo({ ENGRAM_DEMO_TOUR: "1" })
    await again.until(closing)
    expect(again.text()).toContain(
      "The tour is skipped: this fleet is in use (1 session or reservation holds room), and the tour would cordon a host and make a park descend. ENGRAM_DATA_DIR=.engram-tour pnpm start gives it a fleet of its own.",
    )
    expect(again.text()).not.toContain("The tour: two simulated hosts")
    expect(await stateOf("kept")).toBe("parked")
    await stopDemo(again.demo)

    // Without ENGRAM_DEMO_TOUR, a data dir toured once is not toured again.
    const third = startDemo()
    await third.until(closing)
    expect(third.text()).toContain("The tour ran on an earlier start (ENGRAM_DEMO_TOUR=1 shows it again).")
    await stopDemo(third.demo)
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
      await until("the demo is ready", async () => output.join(""), (t) => t.includes(closing) || child.exitCode !== null, 180_000)
      const headers = { authorization: `Bearer ${readFileSync(join(dataDir, "admin-token"), "utf8").trim()}`, "content-type": "application/json" }
      const created = await fetch(`${own.url}/v1/sessions`, { method: "POST", headers, body: JSON.stringify({ id: "g1", memMib: 128, vcpus: 1 }) })
      expect(created.status).toBe(201)
      await until("g1 runs a real guest", async () => ((await (await fetch(`${own.url}/v1/sessions/g1`, { headers })).json()) as { state: string }).state, (st) => st === "running", 180_000)
      // Besides the session's guest, only the agents' template builds (`@template-…`, the demo's template) may run.
      expect(qemuProcesses(stateDir).map((p) => p.vmName).filter((n) => !n.startsWith("@template-"))).toEqual(["g1"])
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
    // 163 s of 420 s in CI c34 at load ≈ 25 (guests boot under TCG): 1,200 s.
  }, 1_200_000)
})
