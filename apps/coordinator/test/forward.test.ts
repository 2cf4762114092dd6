// Placement forwarding (ENGRAM_PLACEMENT_FORWARD=1) with two coordinator processes on one
// PostgreSQL: creates sent to the replica that does not hold the lease are placed by the one that
// does (counted by both); a placer that hangs (SIGSTOP: alive, never answering) costs no create
// and places none twice (each falls back here after the bound; a late forward of the same ids
// answers the stored sessions); the peer endpoint takes the peer token only; a leadership change
// moves the placer.
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { peerToken, placementsPath } from "../src/Forward.js"
import { startChild } from "./support/child.js"
import type { ChildCoordinator } from "./support/child.js"
import { call, client, listAll } from "./support/http.js"
import type { Answer } from "./support/http.js"

const adminToken = "forward-admin-token-0123456789"
// Well above a forward's time on a loaded 2-core machine: only the hang test reaches it.
const boundMs = 3000
// A long lease: a placer paused for the hang test keeps it (no takeover meanwhile).
const leaseMs = 20_000
const renewDeadlineMs = 12_000

/** A counter of a replica's `/metrics` (0 when absent); `labels` as Prometheus writes them, e.g. `{reason="timeout"}`. */
const counter = async (url: string, name: string, labels = ""): Promise<number> => {
  const text = await (await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${adminToken}` } })).text()
  const line = text.split("\n").find((l) => l.startsWith(`${name}${labels} `))
  return line === undefined ? 0 : Number(line.split(" ").pop())
}
const leads = async (url: string): Promise<boolean> => (await counter(url, "engram_reaper_leader")) === 1
const pause = (ms: number) => new Promise((r) => setTimeout(r, ms))

describe("placement forwarding, two replicas on one PostgreSQL", () => {
  let db: TestDatabase
  let dataDir: string
  let placer: ChildCoordinator
  let other: ChildCoordinator
  const env = () => ({
    ENGRAM_DATABASE_URL: db.url,
    ENGRAM_ADMIN_TOKEN: adminToken,
    ENGRAM_LEASE_DURATION_MS: String(leaseMs),
    ENGRAM_LEASE_RENEW_DEADLINE_MS: String(renewDeadlineMs),
    ENGRAM_PLACEMENT_FORWARD: "1",
    ENGRAM_PLACEMENT_FORWARD_TIMEOUT_MS: String(boundMs),
    ENGRAM_DATA_DIR: dataDir,
  })
  beforeAll(async () => {
    db = await freshDatabase()
    dataDir = mkdtempSync(join(tmpdir(), "engram-forward-"))
    // The first takes the lease: the placer. The second starts once it leads.
    placer = await startChild(env())
    while (!(await leads(placer.url))) await pause(50)
    other = await startChild(env())
    const admin = client(placer.url, adminToken)
    for (let h = 0; h < 4; h++) {
      expect((await admin.post("/v1/hosts", { id: `f-h${h}` })).status).toBe(201)
      expect((await admin.put(`/v1/hosts/f-h${h}/report`, { totalMib: 65_536, allocatableMib: 65_536, totalVcpus: 64 })).status).toBe(200)
    }
  })
  afterAll(async () => {
    for (const r of [placer, other]) {
      if (r === undefined) continue
      if (r.process.exitCode === null && r.process.signalCode === null) {
        r.process.kill("SIGCONT")
        r.process.kill("SIGTERM")
      }
    }
    await Promise.all([placer, other].filter((r) => r !== undefined).map((r) => r.exited))
    await db?.drop()
    rmSync(dataDir, { recursive: true, force: true })
  })

  /** Every session of the test placed once: its host's reservations are exactly the budgets placed there. */
  const ledgerAgrees = async () => {
    const admin = client(placer.url, adminToken)
    const hosts = await listAll<{ id: string; reservedMib: number }>(admin, "/v1/hosts")
    const sessions = await listAll<{ id: string; hostId: string | null; budget: { memMib: number } }>(admin, "/v1/sessions")
    const placedMib = new Map<string, number>()
    for (const s of sessions) if (s.hostId !== null) placedMib.set(s.hostId, (placedMib.get(s.hostId) ?? 0) + s.budget.memMib)
    for (const h of hosts) expect(h.reservedMib, h.id).toBe(placedMib.get(h.id) ?? 0)
    return sessions
  }

  it("the peer endpoint takes the peer token only, and refuses a bad batch naming the field", async () => {
    const batch = { creates: [{ id: "f-never", budget: { memMib: 256, vcpus: 1 } }] }
    expect((await call(placer.url, "POST", placementsPath, { body: batch })).status).toBe(401)
    expect((await call(placer.url, "POST", placementsPath, { token: adminToken, body: batch })).status).toBe(401)
    expect((await call(placer.url, "POST", placementsPath, { token: "x".repeat(43), body: batch })).status).toBe(401)
    const bad = await call(placer.url, "POST", placementsPath, { token: peerToken(adminToken), body: { creates: [] } })
    expect(bad.status).toBe(400)
    expect(bad.body.field).toBe("creates")
    const extra = await call(placer.url, "POST", placementsPath, { token: peerToken(adminToken), body: { creates: [{ ...batch.creates[0], hostId: "f-h0" }] } })
    expect(extra.status).toBe(400)
    expect(extra.body.message).toMatch(/^creates\[0\]: /)
    // The API's input rules: no key given twice, UTF-8 only, no query parameter; the bearer as the API reads it.
    const peer = { authorization: `Bearer ${peerToken(adminToken)}`, "content-type": "application/json" }
    const post = (path: string, body: string | Buffer, headers: Record<string, string> = peer) =>
      fetch(`${placer.url}${path}`, { method: "POST", headers, body }).then(async (r) => ({ status: r.status, body: (await r.json()) as Record<string, unknown> }))
    const twice = await post(placementsPath, '{"creates":[{"id":"f-twice","id":"f-twice-2","budget":{"memMib":256,"vcpus":1}}]}')
    expect([twice.status, twice.body.field, twice.body.rule]).toEqual([400, "creates.0.id", "is given more than once in one object (each key at most once)"])
    const latin = await post(placementsPath, Buffer.concat([Buffer.from('{"creates":[{"id":"f-'), Buffer.from([0xe9]), Buffer.from('","budget":{"memMib":256,"vcpus":1}}]}')]))
    expect([latin.status, latin.body.field, latin.body.rule]).toEqual([400, "body", "must be valid UTF-8"])
    const queried = await post(`${placementsPath}?x=1`, JSON.stringify({ creates: [{ id: "f-queried", budget: { memMib: 256, vcpus: 1 } }] }))
    expect([queried.status, queried.body.field, queried.body.in]).toEqual([400, "x", "query"])
    const tab = await post(placementsPath, JSON.stringify({ creates: [{ id: "f-tab", budget: { memMib: 256, vcpus: 1 } }] }), { ...peer, authorization: `Bearer\t${peerToken(adminToken)}` })
    expect(tab.status).toBe(401)
    for (const id of ["f-twice", "f-twice-2", "f-queried", "f-tab"]) expect((await call(placer.url, "GET", `/v1/sessions/${id}`, { token: adminToken })).status, id).toBe(404)
    // A replica that does not hold the lease places nothing for others: its sender places it itself.
    const notLeader = await call(other.url, "POST", placementsPath, { token: peerToken(adminToken), body: batch })
    expect(notLeader.status).toBe(409)
    expect(notLeader.body.error).toBe("NotLeader")
    expect((await client(placer.url, adminToken).get("/v1/sessions/f-never")).status).toBe(404)
  })

  it("creates sent to the other replica are placed by the placer", async () => {
    const api = client(other.url, adminToken)
    // The other replica learns the placer's address at its next look at the lease.
    let i = 0
    while ((await counter(other.url, "engram_placement_forwarded_total")) === 0) {
      expect((await api.post("/v1/sessions", { id: `f-warm${i++}`, memMib: 256, vcpus: 1 })).status).toBe(201)
      if (i > 400) throw new Error("the other replica never forwarded a create")
      await pause(25)
    }
    const before = {
      forwarded: await counter(other.url, "engram_placement_forwarded_total"),
      forPeers: await counter(placer.url, "engram_placement_placed_for_peers_total"),
      writesHere: await counter(other.url, "engram_placement_writes_total"),
      fallbacks: (await counter(other.url, "engram_placement_forward_fallbacks_total", '{reason="timeout"}')) + (await counter(other.url, "engram_placement_forward_fallbacks_total", '{reason="error"}')),
    }
    const n = 40
    const answers = await Promise.all(Array.from({ length: n }, (_, k) => api.post("/v1/sessions", { id: `f-s${k}`, memMib: 512, vcpus: 1 })))
    expect(answers.map((a) => a.status)).toEqual(answers.map(() => 201))
    for (const a of answers) expect(a.body.hostId).toMatch(/^f-h\d$/)
    expect((await counter(other.url, "engram_placement_forwarded_total")) - before.forwarded, other.output().slice(-3000)).toBe(n)
    expect((await counter(placer.url, "engram_placement_placed_for_peers_total")) - before.forPeers).toBe(n)
    // This replica's store wrote none of them.
    expect((await counter(other.url, "engram_placement_writes_total")) - before.writesHere).toBe(0)
    expect((await counter(other.url, "engram_placement_forward_fallbacks_total", '{reason="timeout"}')) + (await counter(other.url, "engram_placement_forward_fallbacks_total", '{reason="error"}'))).toBe(before.fallbacks)
    const sessions = await ledgerAgrees()
    expect(sessions.filter((s) => s.id.startsWith("f-s"))).toHaveLength(n)
    // A create that asked to be refused rather than queued is placed here, never forwarded (a
    // forward that timed out could otherwise be placed by the placer after this replica refused it).
    const refuseMode = await api.post("/v1/sessions", { id: "f-refuse", memMib: 256, vcpus: 1, onNoRoom: "refuse" })
    expect(refuseMode.status).toBe(201)
    expect((await counter(other.url, "engram_placement_forwarded_total")) - before.forwarded).toBe(n)
    expect((await counter(other.url, "engram_placement_writes_total")) - before.writesHere).toBe(1)
    // A repeat under another budget is forwarded too, and refused by the placer's store: the 409
    // keeps what the store said, the session's state among it (before: entity and id only).
    const repeat = await api.post("/v1/sessions", { id: "f-s0", memMib: 1024, vcpus: 1 })
    expect([repeat.status, repeat.body]).toEqual([409, expect.objectContaining({ error: "Conflict", entity: "session", id: "f-s0", state: "pending" })])
    expect((await counter(other.url, "engram_placement_forwarded_total")) - before.forwarded).toBe(n + 1)
  })

  it("a placer that hangs (SIGSTOP) loses no create and places none twice: each is placed here after the bound", async () => {
    const api = client(other.url, adminToken)
    const timeoutsBefore = await counter(other.url, "engram_placement_forward_fallbacks_total", '{reason="timeout"}')
    const n = 20
    const ids = Array.from({ length: n }, (_, k) => `f-hang${k}`)
    placer.process.kill("SIGSTOP")
    let answers: Answer[]
    try {
      answers = await Promise.all(ids.map((id) => api.post("/v1/sessions", { id, memMib: 256, vcpus: 1 })))
    } finally {
      placer.process.kill("SIGCONT")
    }
    expect(answers.map((a) => a.status)).toEqual(answers.map(() => 201))
    expect((await counter(other.url, "engram_placement_forward_fallbacks_total", '{reason="timeout"}')) - timeoutsBefore).toBeGreaterThanOrEqual(1)
    const placedOn = new Map(answers.map((a) => [a.body.id as string, a.body.hostId as string]))
    // The forward the placer took before it froze may still run now that it is awake; run it
    // again anyway, as a late forward would: it answers the stored sessions, placing nothing.
    const late = await call(placer.url, "POST", placementsPath, { token: peerToken(adminToken), body: { creates: ids.map((id) => ({ id, budget: { memMib: 256, vcpus: 1 } })) } })
    expect(late.status).toBe(200)
    for (const [k, a] of (late.body.answers as { placed: { session: { id: string; hostId: string } } }[]).entries()) {
      expect(a.placed.session.id).toBe(ids[k])
      expect(a.placed.session.hostId).toBe(placedOn.get(ids[k]!))
    }
    const sessions = await ledgerAgrees()
    expect(sessions.filter((s) => s.id.startsWith("f-hang"))).toHaveLength(n)
  })

  it("a leadership change moves the placer: the other replica, leading, places its own creates", async () => {
    placer.process.kill("SIGTERM")
    expect(await placer.exited).toBe(0)
    while (!(await leads(other.url))) await pause(50)
    const api = client(other.url, adminToken)
    const forwarded = await counter(other.url, "engram_placement_forwarded_total")
    const writes = await counter(other.url, "engram_placement_writes_total")
    const answers = await Promise.all(Array.from({ length: 10 }, (_, k) => api.post("/v1/sessions", { id: `f-led${k}`, memMib: 256, vcpus: 1 })))
    expect(answers.map((a) => a.status)).toEqual(answers.map(() => 201))
    expect(await counter(other.url, "engram_placement_forwarded_total")).toBe(forwarded)
    expect((await counter(other.url, "engram_placement_writes_total")) - writes).toBeGreaterThanOrEqual(10)
  })
})
