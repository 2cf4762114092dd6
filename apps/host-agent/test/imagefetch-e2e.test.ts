/**
 * A cold resume placed away from its image, end to end: a real coordinator and two agent
 * processes (simulated runtime) over HTTP, with no `ENGRAM_PEERS` (each agent advertises its peer
 * URL; the coordinator gives the image host's with the assignment). A session descends on `a`;
 * `a` has no room for its resume, so the coordinator places it on `b`, whose agent fetches the
 * image from `a`'s peer server and restores it; `a` then removes its copy (and the image of a
 * session that ends). With `a`'s agent gone, `b` keeps the session pending and tries the fetch
 * again until its deadline (`ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS`, 5 s here), then boots fresh,
 * loudly, and the session's history says its memory was lost (`guest_lost`). An image gone from
 * `a`'s disk (wiped, pruned) is `a`'s own "no such image": `b` boots fresh at once and the
 * history says so too, once.
 */
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { Limits } from "@engram/core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type AgentProcess, type Api, api, PEER_SECRET, registerHosts, spawnAgent, until, logLines } from "./support/E2e.js"
import { imageToken, newImageBearer } from "../src/MoveToken.js"

let coordinator: RunningCoordinator
let admin: Api
const agents: Record<string, AgentProcess> = {}

const session = async (id: string) => (await admin.call("GET", `/v1/sessions/${id}`)).body
const waitState = (id: string, state: string, timeoutMs = 30_000) => until(`${id} ${state}`, () => session(id), (s) => s?.state === state, timeoutMs)
const lines = logLines

const missing = "resumed session's descent image is not on this host; booting a fresh guest in its place: its memory is not restored"

/**
 * `id` (2048 MiB) placed on `a`, running, parked; `q` (3072 MiB) queued for the room (b is
 * cordoned, or too full): the reaper descends `id` on `a` and `q` runs there.
 */
const descendOnA = async (id: string, q: string) => {
  expect((await admin.call("POST", "/v1/sessions", { id, memMib: 2048, vcpus: 1, affinity: ["a"] })).body.hostId).toBe("a")
  await waitState(id, "running")
  expect((await admin.call("POST", `/v1/sessions/${id}/idle`)).body.state).toBe("parked")
  expect((await admin.call("POST", "/v1/sessions", { id: q, memMib: 3072, vcpus: 1, affinity: ["a"] })).status).toBe(202)
  await waitState(id, "descended")
  await waitState(q, "running")
  expect((await session(id)).imageHostId).toBe("a")
}

beforeAll(async () => {
  coordinator = await startCoordinator({
    config: {
      port: 0,
      dataDir: mkdtempSync(join(tmpdir(), "engram-imagefetch-e2e-")),
      adminToken: "e2e-admin-token-0123456789",
      limits: { ...Limits.defaults, reaperIntervalMs: 250 },
    },
    logLevel: "Warn",
  })
  admin = api(coordinator.url, coordinator.adminToken)
  const hosts = await registerHosts(admin, coordinator.url, ["a", "b"])
  for (const [id, host] of Object.entries(hosts)) {
    // One at a time: tsx compiles each on start. No peer list: the coordinator tells.
    agents[id] = await spawnAgent({ ...host, peers: "", env: { ENGRAM_AGENT_POLL_WAIT_MS: "5000", ENGRAM_AGENT_HOST: "127.0.0.1", ENGRAM_AGENT_REPORT_MS: "2000", ENGRAM_AGENT_IMAGE_GRACE_MS: "0", ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS: "5000" } })
  }
  await until("hosts measured", async () => (await admin.call("GET", "/v1/hosts")).body.items, (hs: { measured: boolean }[]) => hs.length === 2 && hs.every((h) => h.measured))
}, 240_000)

afterAll(async () => {
  await Promise.all(Object.values(agents).map((a) => a.kill("SIGTERM")))
  await coordinator?.stop()
}, 60_000)

describe("a cold resume placed away from its image fetches it from the host holding it", () => {
  it("the image host's peer server refuses a fetch without the image token", async () => {
    const url = `http://127.0.0.1:${agents.a!.port}/v1/peer/images/nobody?for=b`
    expect((await fetch(url)).status).toBe(401)
    expect((await fetch(url, { headers: { authorization: `Bearer ${imageToken(PEER_SECRET, "nobody", "a", "c", { _tag: "Listing" }, newImageBearer(Date.now()))}` } })).status).toBe(401)
    expect((await fetch(url, { headers: { authorization: `Bearer ${imageToken(PEER_SECRET, "nobody", "a", "b", { _tag: "Listing" }, newImageBearer(Date.now()))}` } })).status).toBe(404)
  })

  it("placed on b (a has no room), the session is restored from the image fetched from a, not booted", async () => {
    expect((await admin.call("POST", "/v1/hosts/b/cordon")).status).toBe(200)
    await descendOnA("s1", "q1")
    expect((await admin.call("POST", "/v1/hosts/b/uncordon")).status).toBe(200)
    // An older image of s1 on b (an earlier descent there): not this descent's, so the fetch replaces it.
    mkdirSync(join(agents.b!.dir, "images", "s1"), { recursive: true })
    writeFileSync(join(agents.b!.dir, "images", "s1", "image"), "an earlier descent")
    writeFileSync(join(agents.b!.dir, "images", "s1", "descent.json"), JSON.stringify({ createdAt: 0, lastActiveAt: 0 }))
    const resumed = await admin.call("POST", "/v1/sessions/s1/resume")
    expect([resumed.status, resumed.body.resumed, resumed.body.hostId]).toEqual([201, "cold", "b"])
    await waitState("s1", "running")
    const b = agents.b!
    expect(lines(b, "descent image fetched from the host holding it", "s1").map((l) => l.imageHostId)).toEqual(["a"])
    expect(lines(b, "restored from its descent image", "s1").map((l) => l.from)).toEqual(["image"])
    expect(lines(b, "started", "s1")).toEqual([])
    expect(lines(b, missing, "s1")).toEqual([])
    expect(b.output.filter((l) => l.includes("is not of its last descent"))).toEqual([])
    expect((await session("s1")).imageHostId).toBeNull()
  }, 120_000)

  it("a's copy of s1's image is removed once s1 runs on b, and an ended session's image once it ends", async () => {
    const imageOf = (agent: AgentProcess, id: string) => join(agent.dir, "images", id, "image")
    // The log line comes after the removal (through the process's pipe): waited for, then the file checked.
    await until("a's removal of s1's copy logged", async () => lines(agents.a!, "descent image removed: its session ended or runs on another host", "s1").length, (n) => n > 0, 60_000)
    expect(lines(agents.a!, "descent image removed: its session ended or runs on another host", "s1")).toHaveLength(1)
    expect(existsSync(imageOf(agents.a!, "s1"))).toBe(false)
    // b removed its fetched copy after the restore (as any restored image).
    expect(existsSync(imageOf(agents.b!, "s1"))).toBe(false)
    // An image kept while its session is descended, removed when it ends.
    expect((await admin.call("DELETE", "/v1/sessions/q1")).status).toBe(200)
    expect((await admin.call("POST", "/v1/hosts/b/cordon")).status).toBe(200)
    await descendOnA("e1", "q1b")
    expect((await admin.call("POST", "/v1/hosts/b/uncordon")).status).toBe(200)
    expect(existsSync(imageOf(agents.a!, "e1"))).toBe(true)
    expect((await admin.call("DELETE", "/v1/sessions/e1")).status).toBe(200)
    await until("a's image of the ended e1 removed", async () => existsSync(imageOf(agents.a!, "e1")), (x) => !x, 60_000)
    expect((await admin.call("DELETE", "/v1/sessions/q1b")).status).toBe(200)
  }, 120_000)

  it("with s3's image gone from a's disk, a answers it has no such image: b boots fresh at once, loudly, and the history says the memory was lost, once, from b", async () => {
    expect((await admin.call("DELETE", "/v1/sessions/s1")).status).toBe(200)
    expect((await admin.call("POST", "/v1/hosts/b/cordon")).status).toBe(200)
    await descendOnA("s3", "q3")
    expect((await admin.call("POST", "/v1/hosts/b/uncordon")).status).toBe(200)
    // a's copy lost (its disk wiped, or pruned): the session still names a as holding it.
    rmSync(join(agents.a!.dir, "images", "s3"), { recursive: true, force: true })
    try {
      const resumed = await admin.call("POST", "/v1/sessions/s3/resume")
      expect([resumed.status, resumed.body.hostId]).toEqual([201, "b"])
      await waitState("s3", "running", 60_000)
      const b = agents.b!
      const absent = lines(b, "descent image could not be fetched from the host holding it: it has no such image; booting a fresh guest, the session's memory is lost (the coordinator is told)", "s3")
      expect(absent.map((l) => [l.level, l.imageHostId])).toEqual([["warn", "a"]])
      expect(lines(b, "descent image could not be fetched from the host holding it; the session stays pending and the fetch is tried again", "s3")).toEqual([])
      expect(lines(b, "started", "s3").map((l) => [l.from, l.imageMissing])).toEqual([["boot", true]])
      const events = async () => ((await admin.call("GET", "/v1/sessions/s3/events")).body.items as { kind: string; hostId?: string; reason?: string }[]).filter((e) => e.kind === "guest_lost")
      const lost = await until("s3's guest_lost recorded", events, (es) => es.length > 0, 30_000)
      expect(lost.map((e) => e.hostId)).toEqual(["b"])
      expect(lost[0]!.reason).toMatch(/^descent image not on host a, which the coordinator names as holding it \(.*no descent image of session s3.*\); booted fresh: the resumed session's memory is lost$/)
    } finally {
      // The next case needs a's room.
      await admin.call("DELETE", "/v1/sessions/s3")
      await admin.call("DELETE", "/v1/sessions/q3")
    }
  }, 120_000)

  it("with the image host's agent gone, the session waits pending while b tries again, then past the deadline boots fresh, loudly, its memory told lost", async () => {
    expect((await admin.call("DELETE", "/v1/sessions/s1")).status).toBe(200)
    expect((await admin.call("POST", "/v1/hosts/b/cordon")).status).toBe(200)
    await descendOnA("s2", "q2")
    expect((await admin.call("POST", "/v1/hosts/b/uncordon")).status).toBe(200)
    await agents.a!.kill("SIGTERM")
    const resumed = await admin.call("POST", "/v1/sessions/s2/resume")
    expect([resumed.status, resumed.body.hostId]).toEqual([201, "b"])
    const b = agents.b!
    const retried = "descent image could not be fetched from the host holding it; the session stays pending and the fetch is tried again"
    await until("b's first failed fetch", async () => lines(b, retried, "s2").length, (n) => n > 0, 30_000)
    expect((await session("s2")).state).toBe("pending")
    await waitState("s2", "running", 60_000)
    expect(lines(b, retried, "s2").every((l) => l.level === "warn" && l.imageHostId === "a")).toBe(true)
    const gaveUp = lines(b, "descent image could not be fetched from the host holding it within ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS; giving up: booting a fresh guest, the session's memory is lost (the coordinator is told)", "s2")
    expect(gaveUp.map((l) => [l.level, l.imageHostId, l.deadlineMs])).toEqual([["warn", "a", 5000]])
    expect(lines(b, missing, "s2").map((l) => l.level)).toEqual(["error"])
    expect(lines(b, "started", "s2").map((l) => [l.from, l.imageMissing])).toEqual([["boot", true]])
    const events = async () => ((await admin.call("GET", "/v1/sessions/s2/events")).body.items as { kind: string; hostId?: string; reason?: string }[]).filter((e) => e.kind === "guest_lost")
    const lost = await until("s2's guest_lost recorded", events, (es) => es.length > 0, 30_000)
    expect(lost.map((e) => e.hostId)).toEqual(["b"])
    expect(lost[0]!.reason).toMatch(/^descent image not fetched from host a within 5000 ms \(ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS; last: .+\); booted fresh: the resumed session's memory is lost$/)
  }, 120_000)
})
