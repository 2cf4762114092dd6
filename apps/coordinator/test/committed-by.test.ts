// Who committed a move (`committedBy` on the move's record), over real HTTP: its source
// (`POST /v1/moves/{id}/commit` with its phases), its target's resolution (`POST
// /v1/moves/{id}/resolve {"outcome":"commit"}` with the target host's token: it runs the guest) or
// an operator (the same resolve with the admin's token). The move's read and the move request's
// answer (`POST /v1/sessions/{id}/move`) say which; a pending or aborted move says null. Run on a
// store that judges the operator's commit itself (`Store.commitMoveByOperator`) and on one without
// it (the coordinator judges it, then commits saying the operator's).
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client } from "./support/http.js"
import { moveBegun, reportedHost } from "./support/moveBegun.js"
import { operatorCommitStores } from "./support/withoutOperatorCommit.js"
import type { Answer } from "./support/http.js"

const adminToken = "committed-by-admin-token-0123456789abcd"
const report = { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 }
const intent = { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 }
const full = { kind: "full", wireBytes: 1e6, apparentBytes: 4e9, sendMs: 100, captureMs: 40 }
const final = { kind: "final", wireBytes: 1e5, apparentBytes: 1e5, sendMs: 30, captureMs: 40 }
const phases = { downtimeMs: 520, captureMs: 40, sendMs: 80, commitMs: 390 }

const stores = operatorCommitStores("a store that judges the operator's commit itself")

describe.each(stores)("who committed a move, on %s", (_, store) => {
  let c: RunningCoordinator
  beforeAll(async () => {
    c = await startCoordinator({ store, reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
  })
  afterAll(() => c?.stop())

  /** A registered host that reported now; its id and token. */
  const addHost = () => reportedHost(c.url, adminToken, report)

  /**
   * A session running on a new host, moving to another: the move begun (its answer not awaited)
   * and its intent, a full and its final round recorded by the source. The move is in doubt.
   */
  const inDoubt = async () => {
    const src = await addHost()
    const dst = await addHost()
    const { moveId, answer } = await moveBegun(c.url, adminToken, src, dst)
    const source = client(c.url, src.token)
    const admin = client(c.url, adminToken)
    for (const [seq, round] of [intent, full, final].entries()) expect((await source.post(`/v1/moves/${moveId}/rounds`, { ...round, seq })).status).toBe(200)
    expect((await admin.get(`/v1/moves/${moveId}`)).body).toMatchObject({ state: "pending", committedBy: null })
    return { src, dst, moveId, answer }
  }

  /** The committed move as its read and the move request's answer show it. */
  const shows = async (moveId: string, answer: Promise<Answer>, by: string) => {
    const read = await client(c.url, adminToken).get(`/v1/moves/${moveId}`)
    expect([read.status, read.body.state, read.body.committedBy]).toEqual([200, "committed", by])
    const answered = await answer
    expect([answered.status, answered.body.move.state, answered.body.move.committedBy]).toEqual([200, "committed", by])
    return answered.body
  }

  it("its source: the commit with its phases", async () => {
    const { src, moveId, answer } = await inDoubt()
    const committed = await client(c.url, src.token).post(`/v1/moves/${moveId}/commit`, phases)
    expect([committed.status, committed.body.committedBy]).toEqual([200, "source"])
    expect(await shows(moveId, answer, "source")).toMatchObject({ downtimeMs: 520 })
  })

  it("its target's resolution: the target's token says it runs the guest", async () => {
    const { dst, moveId, answer } = await inDoubt()
    const resolved = await client(c.url, dst.token).post(`/v1/moves/${moveId}/resolve`, { outcome: "commit", reason: "the target runs the guest" })
    expect([resolved.status, resolved.body.committedBy]).toEqual([200, "target"])
    // Null figures, as an operator's: only committedBy tells them apart.
    expect(await shows(moveId, answer, "target")).toMatchObject({ downtimeMs: null })
  })

  it("an operator: the admin's resolve (engram moves commit)", async () => {
    const { moveId, answer } = await inDoubt()
    const resolved = await client(c.url, adminToken).post(`/v1/moves/${moveId}/resolve`, { outcome: "commit", reason: "the target runs the guest" })
    expect([resolved.status, resolved.body.committedBy]).toEqual([200, "operator"])
    expect(await shows(moveId, answer, "operator")).toMatchObject({ downtimeMs: null })
  })

  it("nobody while aborted", async () => {
    const { moveId, answer } = await inDoubt()
    const aborted = await client(c.url, adminToken).post(`/v1/moves/${moveId}/resolve`, { outcome: "abort", reason: "changed my mind" })
    expect([aborted.status, aborted.body.state, aborted.body.committedBy]).toEqual([200, "aborted", null])
    await answer
  })
})
