/**
 * Descent images across an agent restart, end to end: a real coordinator and one agent process
 * (simulated runtime) started as the README's example does, with `ENGRAM_AGENT_STATE_FILE` and no
 * `ENGRAM_AGENT_IMAGE_DIR`. A session descends (a queued one needs its room), the agent is
 * stopped (SIGTERM) and started again the same way, and the session is resumed.
 */
import { existsSync, mkdtempSync, readFileSync, renameSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { Limits } from "@engram/core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type AgentProcess, type Api, api, type HostSpawn, registerHosts, reportedSince, spawnAgent, until, logLines } from "./support/E2e.js"

// Long enough that the host stays fresh while its agent restarts (tsx compiles on start).
const STALE_MS = 30_000
let coordinator: RunningCoordinator
let admin: Api
let host: HostSpawn
let agent: AgentProcess
const dir = mkdtempSync(join(tmpdir(), "engram-images-e2e-"))
const imageDir = join(dir, "engram-images-h")

const session = async (id: string) => (await admin.call("GET", `/v1/sessions/${id}`)).body
const waitState = (id: string, state: string, timeoutMs = 20_000) => until(`${id} ${state}`, () => session(id), (s) => s?.state === state, timeoutMs)
const lines = logLines

const foreign = "an image under this session's id is not of its last descent (another session of the same id, or an earlier descent); booting fresh, the image is not used"

const start = (env: Record<string, string> = {}) =>
  spawnAgent({ ...host, dir, defaultImageDir: true, env: { ENGRAM_HEARTBEAT_STALE_WINDOW_MS: String(STALE_MS), ENGRAM_AGENT_POLL_WAIT_MS: "5000", ENGRAM_AGENT_REPORT_MS: "2000", ...env } })

/** The agent stopped (SIGTERM) and started again, once the coordinator holds its new report (the host takes placements again). */
const restart = async (env: Record<string, string> = {}) => {
  await agent.kill("SIGTERM")
  // After the old agent exited: none of its reports can count.
  const since = Date.now()
  agent = await start(env)
  await reportedSince(admin, "h", since)
}

/** `id` (2048 MiB) runs, parks, then descends for `q` (2048 MiB: 3072 MiB of room), and `q` ends. */
const descend = async (id: string, q: string) => {
  await waitState(id, "running")
  expect((await admin.call("POST", `/v1/sessions/${id}/idle`)).body.state).toBe("parked")
  const queued = await admin.call("POST", "/v1/sessions", { id: q, memMib: 2048, vcpus: 1 })
  expect(queued.status).toBe(202)
  await waitState(id, "descended")
  await waitState(q, "running")
  expect((await admin.call("DELETE", `/v1/sessions/${q}`)).status).toBe(200)
  await until("nothing resident", () => agent.status(), (st) => st.vms.length === 0)
}

beforeAll(async () => {
  coordinator = await startCoordinator({
    config: {
      port: 0,
      dataDir: mkdtempSync(join(tmpdir(), "engram-images-e2e-coord-")),
      adminToken: "e2e-admin-token-0123456789",
      limits: { ...Limits.defaults, heartbeatStaleWindowMs: STALE_MS, reaperIntervalMs: 250 },
    },
    logLevel: "Warn",
  })
  admin = api(coordinator.url, coordinator.adminToken)
  host = (await registerHosts(admin, coordinator.url, ["h"])).h!
  agent = await start()
  await until("host measured", async () => (await admin.call("GET", "/v1/hosts/h")).body, (h) => h?.measured === true)
}, 120_000)

afterAll(async () => {
  await agent?.kill("SIGTERM")
  await coordinator?.stop()
}, 60_000)

describe("descent images outlive the agent", () => {
  it("the start log names the coordinator, the state file (not loaded on a first start) and the image directory beside it", () => {
    const started = lines(agent, "host agent started")
    expect(started.map((l) => [l.stateFile, l.stateFileLoaded, l.imageDir])).toEqual([[join(dir, "state.json"), false, imageDir]])
    expect(lines(agent, "host agent ready").map((l) => l.coordinatorUrls)).toEqual([[coordinator.url]])
  })

  it("an agent restarted with the same state file restores a session descended before, without a boot", async () => {
    expect((await admin.call("POST", "/v1/sessions", { id: "d1", memMib: 2048, vcpus: 1 })).status).toBe(201)
    await descend("d1", "q1")

    await restart()
    const resumed = await admin.call("POST", "/v1/sessions/d1/resume")
    expect([resumed.status, resumed.body.resumed, resumed.body.hostId]).toEqual([201, "cold", "h"])
    await waitState("d1", "running")
    expect(lines(agent, "started", "d1").map((l) => l.from)).toEqual([])
    expect(lines(agent, "restored from its descent image", "d1").map((l) => l.from)).toEqual(["image"])
    expect(lines(agent, "host agent started").map((l) => [l.stateFile, l.stateFileLoaded, l.imageDir])).toEqual([[join(dir, "state.json"), true, imageDir]])
  }, 120_000)

  it("a resumed session whose image is not on the host boots fresh, loudly: an error naming the session and the path looked for, and a start marked imageMissing", async () => {
    // Room for d2, whatever the case before left.
    await admin.call("DELETE", "/v1/sessions/d1")
    await until("nothing resident", () => agent.status(), (st) => st.vms.length === 0)
    expect((await admin.call("POST", "/v1/sessions", { id: "d2", memMib: 2048, vcpus: 1 })).status).toBe(201)
    await descend("d2", "q2")
    // The operator changes the image directory (as an upgrade from the temporary ones): the image stays in the old one.
    const elsewhere = join(dir, "elsewhere")
    await restart({ ENGRAM_AGENT_IMAGE_DIR: elsewhere })
    const resumed = await admin.call("POST", "/v1/sessions/d2/resume")
    expect([resumed.status, resumed.body.resumed]).toEqual([201, "cold"])
    await waitState("d2", "running", 60_000)
    const said = lines(agent, "resumed session's descent image is not on this host; booting a fresh guest in its place: its memory is not restored", "d2")
    expect(said.map((l) => [l.level, l.imagePath])).toEqual([["error", join(elsewhere, "d2", "image")]])
    expect(lines(agent, "started", "d2").map((l) => [l.from, l.imageMissing])).toEqual([["boot", true]])
    expect(lines(agent, "restored from its descent image", "d2")).toEqual([])
  }, 120_000)

  it("an image under a new session's id (an earlier session's of the same id) is not restored into it: the new session boots fresh", async () => {
    // d2's image stayed in the default directory (the case before ran with another one): planted under a new id.
    await agent.kill("SIGTERM")
    const since = Date.now()
    await admin.call("DELETE", "/v1/sessions/d2")
    renameSync(join(imageDir, "d2"), join(imageDir, "d3"))
    agent = await start()
    await reportedSince(admin, "h", since)
    expect((await admin.call("POST", "/v1/sessions", { id: "d3", memMib: 2048, vcpus: 1 })).status).toBe(201)
    await waitState("d3", "running", 60_000)
    expect(lines(agent, "restored from its descent image", "d3")).toEqual([])
    expect(lines(agent, "started", "d3").map((l) => l.from)).toEqual(["boot"])
    expect(lines(agent, foreign, "d3")).toHaveLength(1)
    // Not restored, and removed once d3's start is recorded: its tag (d2's figures) proves it
    // another session's, so d3 running here supersedes it (a tag-less one would be kept: judged
    // by the figures' clocks alone, a wrong judgement must not cost the memory).
    await until("d2's image removed", async () => existsSync(join(imageDir, "d3", "image")), (there) => !there)
    // Removed once, said once: after `started` answered, or by the scan beside the reconcile when
    // that came first (c119, a loaded machine); the line is read from the agent's output, which may
    // lag the file's removal.
    const removed = () =>
      [
        ...lines(agent, "descent image removed: superseded (the session runs here: its start was recorded)", "d3"),
        ...lines(agent, "descent image removed: superseded (the session runs here again: its start was recorded)", "d3"),
      ].length
    expect(await until("the removal said", async () => removed(), (n) => n > 0)).toBe(1)
  }, 120_000)

  it("an image of an earlier descent of the same session (its tag's lastActiveAt older than the session's) is not restored: the session boots fresh and the image goes once it runs", async () => {
    // d3 runs (it ran, so the figures alone would call any image its own); it descends, writing its tag.
    await descend("d3", "q3")
    const tagFile = join(imageDir, "d3", "descent.json")
    const tag = JSON.parse(readFileSync(tagFile, "utf8")) as { createdAt: unknown; lastActiveAt: unknown }
    expect(tag).toEqual({ createdAt: (await session("d3")).createdAt, lastActiveAt: (await session("d3")).lastActiveAt })
    // As if this image were of an earlier descent (the session ran elsewhere since): its tag is older.
    writeFileSync(tagFile, JSON.stringify({ createdAt: tag.createdAt, lastActiveAt: (tag.lastActiveAt as number) - 60_000 }))
    const before = lines(agent, "started", "d3").length
    expect((await admin.call("POST", "/v1/sessions/d3/resume")).status).toBe(201)
    await waitState("d3", "running", 60_000)
    expect(lines(agent, "restored from its descent image", "d3")).toEqual([])
    expect(lines(agent, "started", "d3").length).toBe(before + 1)
    expect(lines(agent, foreign, "d3").length).toBeGreaterThanOrEqual(2)
    await until("the earlier descent's image removed", async () => existsSync(join(imageDir, "d3", "image")), (there) => !there)
  }, 120_000)
})
