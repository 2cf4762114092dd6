// An operator's commit of a move whose final round is not recorded (SPEC §13, core's
// `Move.refuseOperatorCommit`), over real HTTP: while the move's source is heard (its last report
// within the stale window) it is still sending the move and the target may hold no complete
// copy, so `POST /v1/moves/{id}/resolve {"outcome":"commit"}` with the admin's token is a 409
// naming the rule, and nothing changes. A source silent past the window (frozen or dead) may never
// send the final round: the operator's word stands, as before. A silent source is made without a
// sleep: its report is written by a store whose clock runs ten minutes behind (the window is two).
// Run on a store that judges the rule with its commit (`Store.commitMoveByOperator`, one step) and
// on one without it (the coordinator judges it on a read of the source, then commits).
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { shiftedLayer } from "./support/clock.js"
import type { Shift } from "./support/clock.js"
import { client } from "./support/http.js"
import { moveBegun, reportedHost } from "./support/moveBegun.js"
import { operatorCommitStores } from "./support/withoutOperatorCommit.js"

const adminToken = "operator-commit-admin-token-0123456789"
const tenMinutesMs = 10 * 60_000
const report = { totalMib: 4096, allocatableMib: 3072, totalVcpus: 8 }
const intent = { kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 }
const full = { kind: "full", wireBytes: 1e6, apparentBytes: 4e9, sendMs: 100, captureMs: 40 }
const final = { kind: "final", wireBytes: 1e5, apparentBytes: 1e5, sendMs: 0, captureMs: 40 }

const stores = operatorCommitStores("a store that judges it with the commit")

describe.each(stores)("an operator's commit before the move's final round, on %s", (_, store) => {
  const shift: Shift = { ms: 0 }
  let c: RunningCoordinator
  beforeAll(async () => {
    c = await startCoordinator({ store: shiftedLayer(store, shift), reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
  })
  afterAll(() => c?.stop())

  /** A registered host that reported now; its id and token. */
  const addHost = () => reportedHost(c.url, adminToken, report)

  /** A session running on `src`, a move of it to `dst` begun (its answer not awaited), the intent and a full round recorded by the source. */
  const moveInPreCopy = async (src: { id: string; token: string }, dst: { id: string }) => {
    const { sid, moveId, answer } = await moveBegun(c.url, adminToken, src, dst)
    const source = client(c.url, src.token)
    expect((await source.post(`/v1/moves/${moveId}/rounds`, { ...intent, seq: 0 })).status).toBe(200)
    expect((await source.post(`/v1/moves/${moveId}/rounds`, { ...full, seq: 1 })).status).toBe(200)
    return { sid, moveId, answer }
  }

  it("is refused (409 naming the rule, nothing changed) while the source is heard; allowed once the final round is recorded", async () => {
    const admin = client(c.url, adminToken)
    const src = await addHost()
    const dst = await addHost()
    const { sid, moveId, answer } = await moveInPreCopy(src, dst)
    const refused = await admin.post(`/v1/moves/${moveId}/resolve`, { outcome: "commit", reason: "the source looks stuck" })
    expect(refused.status).toBe(409)
    expect(refused.body).toMatchObject({ error: "Conflict", entity: "move", id: moveId })
    expect(refused.body.message).toMatch(
      new RegExp(`the move's source ${src.id} is heard \\(its last report \\d+ s ago, within the 120 s stale window\\) and the move's final round is not recorded yet: the target may hold no complete copy; wait for the final round \\(or the target's own commit\\) or abort$`),
    )
    expect((await admin.get(`/v1/moves/${moveId}`)).body).toMatchObject({ state: "pending" })
    expect((await admin.get(`/v1/sessions/${sid}`)).body).toMatchObject({ state: "moving", hostId: src.id })
    // The source goes on: its next round is recorded, not refused as after a commit.
    expect((await client(c.url, src.token).post(`/v1/moves/${moveId}/rounds`, { ...final, seq: 2 })).status).toBe(200)
    // The final round recorded, the target holds the complete stream: the operator's word stands.
    const committed = await admin.post(`/v1/moves/${moveId}/resolve`, { outcome: "commit", reason: "the target runs the guest" })
    expect([committed.status, committed.body.state]).toEqual([200, "committed"])
    expect((await admin.get(`/v1/sessions/${sid}`)).body).toMatchObject({ state: "running", hostId: dst.id })
    await answer
  })

  it("an abort stays the operator's word while the source is heard", async () => {
    const admin = client(c.url, adminToken)
    const { sid, moveId, answer } = await moveInPreCopy(await addHost(), await addHost())
    const aborted = await admin.post(`/v1/moves/${moveId}/resolve`, { outcome: "abort", reason: "changed my mind" })
    expect([aborted.status, aborted.body.state]).toEqual([200, "aborted"])
    expect((await admin.get(`/v1/sessions/${sid}`)).body).toMatchObject({ state: "running" })
    await answer
  })

  it("is allowed, as before, when the source is silent past the stale window (frozen or dead)", async () => {
    const admin = client(c.url, adminToken)
    const src = await addHost()
    const dst = await addHost()
    const { sid, moveId, answer } = await moveInPreCopy(src, dst)
    // The source's last report ten minutes ago: it has gone silent.
    shift.ms = -tenMinutesMs
    expect((await client(c.url, src.token).put(`/v1/hosts/${src.id}/report`, report)).status).toBe(200)
    shift.ms = 0
    expect((await admin.get(`/v1/hosts/${src.id}`)).body.silent).toBe(true)
    const committed = await admin.post(`/v1/moves/${moveId}/resolve`, { outcome: "commit", reason: "the source host is frozen" })
    expect([committed.status, committed.body.state, committed.body.phases]).toEqual([200, "committed", null])
    expect((await admin.get(`/v1/sessions/${sid}`)).body).toMatchObject({ state: "running", hostId: dst.id })
    await answer
  })
})
