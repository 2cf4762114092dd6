/**
 * The guard's learned commit allowance end to end (SPEC §13): a real coordinator and two agent
 * processes (simulated runtime, quick commits) over HTTP. The coordinator keeps each host pair's
 * recent commit phases and hands the learned allowance to a move's source, so a restarted agent
 * (its memory gone) admits a budget under the prior (the configured `commitAllowanceMs`) that it refused before any history,
 * and the move record shows what the guard decided on and how far off it was.
 */
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { Limits } from "@engram/core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type AgentProcess, type Api, api, freePort, reportedSince, spawnAgent, until } from "./support/E2e.js"

/** Commits of about 20 ms and a guest that dirties little: the learned allowance is far under the prior. */
const SIM = JSON.stringify({ commitMs: 20, dirtyBytesPerMs: 65_536, workingSetBytes: 1024 * 1024 })
/**
 * The coordinator's prior, and a budget under it that is far over the learned allowance. Both
 * are large because this runs in real time on a loaded machine, where a commit phase (HTTP round
 * trips between three processes) can take a few hundred ms; the rule is the same at 400 ms.
 */
const PRIOR_MS = 5000
const BUDGET_MS = 3000

let coordinator: RunningCoordinator
let admin: Api
const agents: Record<string, AgentProcess> = {}
const ports: Record<string, number> = {}
const tokens: Record<string, string> = {}
let peers = ""

const start = (id: string, dir?: string) =>
  spawnAgent({
    hostId: id,
    port: ports[id]!,
    coordinatorUrl: coordinator.url,
    hostToken: tokens[id]!,
    peers,
    env: { ENGRAM_AGENT_POLL_WAIT_MS: "5000", ENGRAM_SIM: SIM },
    ...(dir === undefined ? {} : { dir }),
  })

const session = async (id: string) => (await admin.call("GET", `/v1/sessions/${id}`)).body
const move = (to: string, maxDowntimeMs: number) => admin.call("POST", "/v1/sessions/s1/move", { targetHostId: to, maxDowntimeMs })
const settledOn = (hostId: string) =>
  until(`s1 running on ${hostId}, its source copy gone`, async () => [await session("s1"), await agents[hostId === "a" ? "b" : "a"]!.status()] as const, ([s, src]) =>
    s.state === "running" && s.hostId === hostId && src.vms.length === 0 && src.pendingCommits.length === 0,
  )

beforeAll(async () => {
  coordinator = await startCoordinator({
    config: {
      port: 0,
      dataDir: mkdtempSync(join(tmpdir(), "engram-allowance-e2e-")),
      adminToken: "e2e-admin-token-0123456789",
      limits: { ...Limits.defaults, commitAllowanceMs: PRIOR_MS },
      moveTimeoutMs: 20_000,
    },
    logLevel: "Warn",
  })
  admin = api(coordinator.url, coordinator.adminToken)
  for (const id of ["a", "b"]) {
    ports[id] = await freePort()
    const created = await admin.call("POST", "/v1/hosts", { id })
    expect(created.status).toBe(201)
    tokens[id] = created.body.token
  }
  peers = ["a", "b"].map((id) => `${id}=http://127.0.0.1:${ports[id]}`).join(",")
  // One at a time: tsx compiles each on start.
  for (const id of ["a", "b"]) agents[id] = await start(id)
  await until("hosts measured", async () => (await admin.call("GET", "/v1/hosts")).body.items, (hs: { measured: boolean }[]) => hs.length === 2 && hs.every((h) => h.measured))
}, 240_000)

afterAll(async () => {
  await Promise.all(Object.values(agents).map((a) => a.kill("SIGTERM")))
  await coordinator?.stop()
}, 60_000)

describe("the commit allowance is learned and kept by the coordinator", () => {
  it("before any commit, a budget under the prior is refused before any pause; the host shows no history", async () => {
    expect((await admin.call("POST", "/v1/sessions", { id: "s1", memMib: 512, vcpus: 1, affinity: ["a"] })).body.hostId).toBe("a")
    await until("s1 running", () => session("s1"), (s) => s?.state === "running")
    const refused = await move("b", BUDGET_MS)
    expect(refused.status).toBe(503)
    expect(refused.body.error).toBe("ErrMoveDowntime")
    expect(refused.body.estimateMs).toBeGreaterThanOrEqual(PRIOR_MS)
    const shown = await admin.call("GET", "/v1/hosts/a/allowances")
    expect(shown.status).toBe(200)
    expect(shown.body).toEqual({ hostId: "a", priorMs: PRIOR_MS, horizonMs: 3_600_000, items: [] })
  }, 60_000)

  it("commits between the two hosts are kept per pair; the first one's guard used the prior", async () => {
    const first = await move("b", 2 * PRIOR_MS)
    expect(first.status).toBe(200)
    expect(first.body.move.guard).toMatchObject({ allowanceMs: PRIOR_MS, allowanceSource: "prior", allowanceSamples: 0 })
    expect(first.body.move.guard.allowanceErrorMs).toBe(PRIOR_MS - first.body.commitMs)
    await settledOn("b")
    expect((await move("a", 2 * PRIOR_MS)).status).toBe(200)
    await settledOn("a")
    expect((await move("b", 2 * PRIOR_MS)).status).toBe(200)
    await settledOn("b")
    const shown = (await admin.call("GET", "/v1/hosts/a/allowances")).body
    expect(shown.items).toHaveLength(1)
    expect(shown.items[0]).toMatchObject({ sourceHostId: "a", targetHostId: "b", source: "learned", samples: 2 })
    expect(shown.items[0].allowanceMs).toBe(Math.max(...shown.items[0].commitsMs))
    expect(shown.items[0].allowanceMs).toBeLessThan(BUDGET_MS)
    // A host's token reads its own pairs only.
    expect((await api(coordinator.url, tokens.a!).call("GET", "/v1/hosts/a/allowances")).status).toBe(200)
    expect((await api(coordinator.url, tokens.b!).call("GET", "/v1/hosts/a/allowances")).status).toBe(403)
  }, 90_000)

  it("a restarted agent gets the learned allowance from the coordinator: the budget it refused is admitted, and the record shows the guard", async () => {
    const learned = (await admin.call("GET", "/v1/hosts/a/allowances")).body.items[0]
    const dir = agents.a!.dir
    await agents.a!.kill("SIGTERM")
    const since = Date.now()
    agents.a = await start("a", dir)
    expect((await agents.a.status()).allowances).toEqual([]) // its own memory is empty
    // Its host takes moves once its report is in (a restart slower than the stale window leaves it silent till then).
    await reportedSince(admin, "a", since)
    expect((await move("a", 2 * PRIOR_MS)).status).toBe(200)
    await settledOn("a")
    const admitted = await move("b", BUDGET_MS)
    expect(admitted.status, JSON.stringify(admitted.body)).toBe(200)
    const m = (await admin.call("GET", `/v1/moves/${admitted.body.move.id}`)).body
    const { downtimeMs, captureMs, sendMs, commitMs } = m.phases
    // The phases name every part of the pause: they sum to it.
    expect(Math.abs(captureMs + sendMs + commitMs - downtimeMs)).toBeLessThan(0.001)
    expect(m.guard).toEqual({
      allowanceMs: learned.allowanceMs,
      allowanceSource: "learned",
      allowanceSamples: 2,
      estimateMs: m.guard.estimateMs,
      estimateErrorMs: m.guard.estimateMs - downtimeMs,
      allowanceErrorMs: learned.allowanceMs - commitMs,
    })
    expect(m.guard.estimateMs).toBeLessThanOrEqual(BUDGET_MS)
    const after = (await admin.call("GET", "/v1/hosts/a/allowances")).body.items[0]
    expect(after.samples).toBe(3)
    expect(after.commitsMs.at(-1)).toBe(commitMs)
  }, 90_000)
})
