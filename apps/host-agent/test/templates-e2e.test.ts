/**
 * End to end, templates: a real coordinator and two real agent processes (simulated runtime)
 * over HTTP. Host b is configured with a template, host a with none. The host reports carry the
 * templates b holds, placement prefers b for a session that names it (a would win the tie by id
 * otherwise), b's agent starts it from the template, and a host without the template still
 * takes a session that names it (its agent builds the template first).
 */
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type AgentProcess, type Api, api, registerHosts, spawnAgent, until } from "./support/E2e.js"

let coordinator: RunningCoordinator
let admin: Api
const agents: Record<string, AgentProcess> = {}

const session = async (id: string) => (await admin.call("GET", `/v1/sessions/${id}`)).body
const waitState = (id: string, state: string, timeoutMs = 30_000) => until(`${id} ${state}`, () => session(id), (s) => s?.state === state, timeoutMs)

/** The agent's log line that says how it started the session (`from`: boot, template or image). */
const startedLine = (agent: AgentProcess, sessionId: string) =>
  until(
    `${agent.hostId} started ${sessionId}`,
    async () => agent.output.find((l) => l.includes('"started"') && l.includes(`"sessionId":"${sessionId}"`)),
    (l) => l !== undefined,
    30_000,
  )

beforeAll(async () => {
  coordinator = await startCoordinator({
    config: { port: 0, dataDir: mkdtempSync(join(tmpdir(), "engram-templates-e2e-")), adminToken: "e2e-admin-token-0123456789" },
    logLevel: "Warn",
  })
  admin = api(coordinator.url, coordinator.adminToken)
  const ids = ["a", "b"]
  const hosts = await registerHosts(admin, coordinator.url, ids)
  // One at a time: tsx compiles each on start, and the machine may have two cores.
  for (const id of ids) {
    agents[id] = await spawnAgent({
      ...hosts[id]!,
      env: { ENGRAM_AGENT_REPORT_MS: "500", ENGRAM_AGENT_POLL_WAIT_MS: "5000", ...(id === "b" ? { ENGRAM_AGENT_TEMPLATES: "py=512:1" } : {}) },
    })
  }
}, 240_000)

afterAll(async () => {
  await Promise.all(Object.values(agents).map((a) => a.kill("SIGTERM")))
  await coordinator?.stop()
}, 60_000)

describe("templates, end to end", () => {
  it("a host's report carries the templates it holds; GET /v1/hosts/:id and the fleet show them", async () => {
    const b = await until("b reports py", async () => (await admin.call("GET", "/v1/hosts/b")).body, (h) => (h?.report?.templates ?? []).length > 0, 60_000)
    expect(b.report.templates).toEqual([{ name: "py", memMib: 512, vcpus: 1 }])
    const a = (await admin.call("GET", "/v1/hosts/a")).body
    expect(a.measured).toBe(true)
    expect(a.report.templates).toEqual([])
    expect((await admin.call("GET", "/v1/fleet")).body.templates).toEqual([{ name: "py", memMib: 512, vcpus: 1, hosts: 1 }])
  }, 90_000)

  it("a session that names a template is placed on the host holding it, whose agent starts it from the template", async () => {
    // Without a template, the tie of two empty hosts goes by id: a. Then a is the best fit.
    const plain = await admin.call("POST", "/v1/sessions", { id: "s0", memMib: 512, vcpus: 1 })
    expect(plain.body.hostId).toBe("a")
    const created = await admin.call("POST", "/v1/sessions", { id: "s1", memMib: 512, vcpus: 1, template: "py" })
    expect(created.status).toBe(201)
    expect(created.body.hostId).toBe("b")
    expect((await session("s1")).template).toBe("py")
    expect((await session("s0")).template).toBeNull()
    await waitState("s1", "running")
    expect(await startedLine(agents["b"]!, "s1")).toContain('"from":"template"')
    await waitState("s0", "running")
    expect(await startedLine(agents["a"]!, "s0")).toContain('"from":"boot"')
  }, 60_000)

  it("a host without the template still takes the session; its agent builds the template and starts from it", async () => {
    const created = await admin.call("POST", "/v1/sessions", { id: "s2", memMib: 512, vcpus: 1, template: "py", affinity: ["a"] })
    expect(created.status).toBe(201)
    expect(created.body.hostId).toBe("a")
    await waitState("s2", "running")
    expect(await startedLine(agents["a"]!, "s2")).toContain('"from":"template"')
    await until("a reports py", async () => (await admin.call("GET", "/v1/hosts/a")).body, (h) => (h?.report?.templates ?? []).length > 0, 30_000)
  }, 60_000)

  it("a bad template name is a 400 naming the field, and stores nothing", async () => {
    for (const template of [".hidden", "a/b", "", "x".repeat(101)]) {
      const refused = await admin.call("POST", "/v1/sessions", { id: "bad", memMib: 512, vcpus: 1, template })
      expect(refused.status).toBe(400)
      expect(refused.body.field).toBe("template")
    }
    expect((await admin.call("GET", "/v1/sessions/bad")).status).toBe(404)
  })
})
