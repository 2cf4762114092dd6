// A move asked for through the API goes to the host the operator names, though that host takes
// no moves (its agent advertises no peer URL; the reaper plans none there): begun, not refused,
// and the coordinator's log says the source can reach it only at its own ENGRAM_PEERS entry.
// Over real HTTP on the in-memory store, the log (stdout) captured.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client, logged, uid } from "./support/http.js"

const adminToken = "movetarget-admin-token-0123456789"
const report = (peerUrl?: string, allocatableMib = 3072) => ({ totalMib: Math.max(4096, allocatableMib), allocatableMib, totalVcpus: 8, ...(peerUrl === undefined ? {} : { peerUrl }) })

let c: RunningCoordinator
beforeAll(async () => {
  c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Warn", config: { port: 0, adminToken } })
})
afterAll(() => c?.stop())


describe("an API move to a host that takes no moves", () => {
  const admin = () => client(c.url, adminToken)
  const addHost = async (peerUrl?: string, allocatableMib?: number) => {
    const id = uid("h")
    expect((await admin().post("/v1/hosts", { id })).status).toBe(201)
    expect((await admin().put(`/v1/hosts/${id}/report`, report(peerUrl, allocatableMib))).status).toBe(200)
    return id
  }
  /** A session of `memMib` running on `src`. */
  const runningOn = async (src: string, memMib = 256) => {
    const sid = uid("s")
    expect((await admin().post("/v1/sessions", { id: sid, memMib, vcpus: 1, affinity: [src] })).body.hostId).toBe(src)
    expect((await admin().post(`/v1/sessions/${sid}/started`)).status).toBe(200)
    return sid
  }
  /**
   * Moves a running session from `src` to `dst` (the store's pick when undefined) through the API; its source aborts it
   * once begun. Answers the move's target and the answer's status.
   */
  const moveTo = async (src: string, dst: string | undefined, memMib = 256) => {
    const sid = await runningOn(src, memMib)
    const answer = admin().post(`/v1/sessions/${sid}/move`, { ...(dst === undefined ? {} : { targetHostId: dst }), maxDowntimeMs: 600 })
    let move: { id: string; targetHostId: string } | undefined
    // Up to 30 s for the move to show up (a loaded machine); it shows up at its begin.
    for (let i = 0; i < 300 && move === undefined; i++) {
      const pending = (await admin().get(`/v1/moves?hostId=${src}&state=pending`)).body.items as { id: string; sessionId: string; targetHostId: string }[]
      move = pending.find((m) => m.sessionId === sid)
      if (move === undefined) await new Promise((r) => setTimeout(r, 100))
    }
    expect(move).toBeDefined()
    expect((await admin().post(`/v1/moves/${move!.id}/abort`, { reason: "test: no agent runs here" })).status).toBe(200)
    return { targetHostId: move!.targetHostId, status: (await answer).status }
  }

  it("is begun (the operator's choice), and the log says the source reaches it only at its own ENGRAM_PEERS entry; a host with a URL is not warned about", async () => {
    const src = await addHost("http://10.0.0.1:7100")
    const bare = await addHost()
    const reachable = await addHost("http://10.0.0.3:7100")
    const { result: toBare, lines } = await logged(() => moveTo(src, bare))
    expect(toBare.targetHostId).toBe(bare)
    // Aborted by its source here, so the answer is the abort's 503, not a refusal of the move.
    expect(toBare.status).toBe(503)
    const warned = lines.split("\n").filter((l) => l.includes("move target advertises no peer URL"))
    expect(warned).toHaveLength(1)
    expect(warned[0]).toContain(bare)
    const { result: toReachable, lines: quiet } = await logged(() => moveTo(src, reachable))
    expect([toReachable.targetHostId, toReachable.status]).toEqual([reachable, 503])
    expect(quiet).not.toContain("advertises no peer URL")
  })
  it("without a targetHostId goes only to a host that takes moves: none with room is a 409 Refused (no_fit) saying so, nothing changed; then the one that does", async () => {
    // Hosts far larger than the others here, so that only they can take the 8 GiB session.
    const src = await addHost("http://10.0.1.1:7100", 16384)
    await addHost(undefined, 16384)
    const sid = await runningOn(src, 8192)
    const refused = await admin().post(`/v1/sessions/${sid}/move`, { maxDowntimeMs: 600 })
    expect([refused.status, refused.body.error, refused.body.check]).toEqual([409, "Refused", "no_fit"])
    expect(refused.body.message).toBe(`no host other than ${src} that takes moves (its agent advertises a peer URL) has room for the session`)
    expect((await admin().get(`/v1/sessions/${sid}`)).body).toMatchObject({ state: "running", hostId: src })
    expect((await admin().get(`/v1/moves?hostId=${src}&state=pending`)).body.items).toEqual([])
    expect((await admin().del(`/v1/sessions/${sid}`)).status).toBeLessThan(300)
    const lit = await addHost("http://10.0.1.3:7100", 16384)
    expect(await moveTo(src, undefined, 8192)).toEqual({ targetHostId: lit, status: 503 })
  })
})
