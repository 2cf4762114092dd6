// The calls of the session-lifecycle contract (warm resume, waits, events, host removal and
// token rotation, refusing instead of queueing) against a real coordinator.
import type { RunningCoordinator } from "@engram/coordinator"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Conflict, createClient, NoRoom, Unauthorized, WaitTimeout } from "../src/index.js"
import type { Engram } from "../src/index.js"
import { addHost, adminToken, start, started, uid } from "./support/Fleet.js"

let c: RunningCoordinator
let engram: Engram
const host = uid("h")

beforeAll(async () => {
  c = await start()
  engram = createClient({ baseUrl: c.url, token: adminToken })
  await addHost(c.url, host, 4096, 4)
})
afterAll(() => c?.stop())

describe("resume and wait", () => {
  it("a parked session resumes warm on the same host", async () => {
    const id = uid("s")
    await engram.sessions.create({ id, memMib: 512, vcpus: 1 })
    await started(c.url, id)
    await engram.sessions.idle(id)
    const resumed = await engram.sessions.resume(id)
    expect(resumed).toMatchObject({ outcome: "placed", id, state: "running", hostId: host, resumed: "warm" })
    await engram.sessions.end(id)
  })

  it("wait answers the session once it is in the state, and WaitTimeout when time runs out", async () => {
    const id = uid("s")
    await engram.sessions.create({ id, memMib: 512, vcpus: 1 })
    const waited = engram.sessions.wait(id, { state: "running", timeoutMs: 30_000 })
    await started(c.url, id)
    expect(await waited).toMatchObject({ id, state: "running" })
    const err = await engram.sessions.wait(id, { state: "parked", timeoutMs: 50 }).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(WaitTimeout)
    expect(err).toMatchObject({ state: "running" })
    await engram.sessions.end(id)
  })

  it("a queued session's get says where it stands and why", async () => {
    const id = uid("q")
    await engram.sessions.create({ id, memMib: 64 * 1024, vcpus: 1 })
    const s = await engram.sessions.get(id)
    expect(s.queue).toMatchObject({ position: expect.any(Number), tooBig: true })
    expect(s.queue?.noFit.map((d) => d.hostId)).toContain(host)
    await engram.sessions.end(id)
  })
})

describe("events", () => {
  it("a session's history lists what happened to it, oldest first", async () => {
    const id = uid("e")
    await engram.sessions.create({ id, memMib: 256, vcpus: 1 })
    await engram.sessions.end(id)
    const page = await engram.sessions.events(id)
    const kinds = page.items.map((e) => e.kind)
    expect(kinds[0]).toBe("created")
    expect(kinds.at(-1)).toBe("ended")
    expect(page.items.map((e) => e.seq)).toEqual([...page.items.map((e) => e.seq)].sort((a, b) => a - b))
  })

  it("a create repeated after the session ended is a Conflict carrying its state, not an answer of queued", async () => {
    const id = uid("e")
    await engram.sessions.create({ id, memMib: 256, vcpus: 1 })
    await engram.sessions.end(id)
    const err = await engram.sessions.create({ id, memMib: 256, vcpus: 1 }).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(Conflict)
    expect(err).toMatchObject({ status: 409, entity: "session", id, state: "ended" })
  })
})

describe("hosts and refusals", () => {
  it("onNoRoom: refuse fails with NoRoom and each host's reason, and queues nothing", async () => {
    const id = uid("r")
    const err = await engram.sessions.create({ id, memMib: 64 * 1024, vcpus: 1, onNoRoom: "refuse" }).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(NoRoom)
    expect((err as NoRoom).noFit.map((d) => d.hostId)).toContain(host)
    expect(await engram.sessions.get(id).catch((e: unknown) => e)).toMatchObject({ status: 404 })
  })

  it("a host with reservations cannot be removed; an empty one can", async () => {
    const h = uid("rm")
    await addHost(c.url, h, 2048, 2)
    const id = uid("s")
    await engram.sessions.create({ id, memMib: 256, vcpus: 1, affinity: [h] })
    await expect(engram.hosts.remove(h)).rejects.toBeInstanceOf(Conflict)
    await engram.sessions.end(id)
    await engram.hosts.remove(h)
    expect(await engram.hosts.get(h).catch((e: unknown) => e)).toMatchObject({ status: 404 })
  })

  it("a rotated host token replaces the old one", async () => {
    const h = uid("tok")
    const created = await engram.hosts.create({ id: h })
    const { token } = await engram.hosts.rotateToken(h)
    expect(token).not.toBe(created.token)
    await expect(createClient({ baseUrl: c.url, token: created.token }).hosts.get(h)).rejects.toBeInstanceOf(Unauthorized)
    expect(await createClient({ baseUrl: c.url, token }).hosts.get(h)).toMatchObject({ id: h })
  })
})
