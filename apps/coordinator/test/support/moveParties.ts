/**
 * Who may read a session placed elsewhere (`GET /v1/sessions/{id}`): its host's agent, and the
 * agents of the source and the target of its latest move (a move's source owing its target a
 * resend tells "still placed on the target" from "no longer" by this read), nobody else; every
 * other step stays its host's. A move's resend mark: its source sets and clears it, its target only
 * clears it. Run over HTTP on a coordinator per store (the API suite), and on a
 * store without `latestMove` (the coordinator reads the session's history instead) or
 * `markResendOwed` (its resend endpoint answers 400 naming `owed`).
 */
import { expect } from "vitest"
import { type Client, client, uid } from "./http.js"

const final = { kind: "final", wireBytes: 1e6, apparentBytes: 1e6, sendMs: 0, captureMs: 40 }

/** A host's agent: its id and token, and its client. */
interface Agent {
  readonly id: string
  readonly http: Client
}

export const moveParties = async (url: string, admin: Client, options: { readonly resendMark: boolean }): Promise<void> => {
  const addHost = async (): Promise<Agent> => {
    const id = uid("h")
    const created = await admin.post("/v1/hosts", { id })
    expect(created.status).toBe(201)
    expect((await admin.put(`/v1/hosts/${id}/report`, { totalMib: 2048, allocatableMib: 2048, totalVcpus: 8 })).status).toBe(200)
    return { id, http: client(url, created.body.token as string) }
  }
  /** The move of `sessionId` in `source`'s assignments. */
  const moveOf = async (source: Agent, sessionId: string): Promise<string> => {
    for (let i = 0; i < 100; i++) {
      const a = await source.http.get(`/v1/hosts/${source.id}/assignments`)
      const m = (a.body.moves as { id: string; sessionId: string }[]).find((x) => x.sessionId === sessionId)
      if (m !== undefined) return m.id
      await new Promise((resolve) => setTimeout(resolve, 20))
    }
    throw new Error(`no move of ${sessionId} in ${source.id}'s assignments`)
  }
  /** `sessionId` moved from `source` to `target`, committed on the target's report (no phases: as an operator's or a target's resolution). */
  const moved = async (sessionId: string, source: Agent, target: Agent): Promise<string> => {
    const answer = admin.post(`/v1/sessions/${sessionId}/move`, { targetHostId: target.id, maxDowntimeMs: 600 })
    const moveId = await moveOf(source, sessionId)
    expect((await source.http.post(`/v1/moves/${moveId}/rounds`, final)).status).toBe(200)
    expect((await target.http.post(`/v1/moves/${moveId}/resolve`, { outcome: "commit", reason: "the target runs the guest" })).status).toBe(200)
    // Committed: the move request answers 200 (its figures null, the pause not measured), not 503 MoveAborted.
    const done = await answer
    expect([done.status, done.body.move?.state, done.body.downtimeMs]).toEqual([200, "committed", null])
    return moveId
  }
  const read = async (who: Agent, sessionId: string) => {
    const r = await who.http.get(`/v1/sessions/${sessionId}`)
    return r.status === 200 ? { status: 200, state: r.body.state as string, hostId: r.body.hostId as string | null } : { status: r.status }
  }

  const src = await addHost()
  const dst = await addHost()
  const next = await addHost()
  const stranger = await addHost()
  const sid = uid("s")
  expect((await admin.post("/v1/sessions", { id: sid, memMib: 256, vcpus: 1, affinity: [src.id] })).body.hostId).toBe(src.id)
  expect((await src.http.post(`/v1/sessions/${sid}/started`)).status).toBe(200)
  // Before any move: its host only.
  expect(await read(dst, sid)).toEqual({ status: 403 })

  const first = await moved(sid, src, dst)
  // Before: 403 (the session's host only), which the source's agent took for "ended or not
  // visible", and its resend settling destroyed the guest's only whole copy.
  expect(await read(src, sid)).toEqual({ status: 200, state: "running", hostId: dst.id })
  expect(await read(dst, sid)).toEqual({ status: 200, state: "running", hostId: dst.id })
  expect(await read(stranger, sid)).toEqual({ status: 403 })
  // Reading is all: the session's other steps, and its history, stay its host's.
  expect((await src.http.get(`/v1/sessions/${sid}/events`)).status).toBe(403)
  expect((await src.http.post(`/v1/sessions/${sid}/idle`)).status).toBe(403)
  expect((await src.http.del(`/v1/sessions/${sid}`)).status).toBe(403)
  expect(await read(src, sid)).toEqual({ status: 200, state: "running", hostId: dst.id })

  // The source's resend mark: kept by a store with `markResendOwed`; without it, a 400 naming
  // `owed` (what a source's agent takes as a coordinator older than the mark), nothing changed.
  const mark = await src.http.post(`/v1/moves/${first}/resend`, { owed: true })
  if (options.resendMark) expect(mark.status).toBe(200)
  else expect([mark.status, mark.body.field]).toEqual([400, "owed"])
  // The record carries the mark as kept: set by a store that keeps it, false on one that keeps none.
  expect((await admin.get(`/v1/moves/${first}`)).body.resendOwed).toBe(options.resendMark)
  if (options.resendMark) expect((await src.http.post(`/v1/moves/${first}/resend`, { owed: false })).status).toBe(200)
  expect((await admin.get(`/v1/moves/${first}`)).body.resendOwed).toBe(false)
  // A host not the move's source is refused first, whatever the store.
  expect((await stranger.http.post(`/v1/moves/${first}/resend`, { owed: true })).status).toBe(403)
  // Its target may clear the mark (before it resumes a stream sent again), never set it; a
  // stranger neither. Before: only the source (or the admin) cleared it, the target's 403.
  if (options.resendMark) expect((await src.http.post(`/v1/moves/${first}/resend`, { owed: true })).status).toBe(200)
  expect((await dst.http.post(`/v1/moves/${first}/resend`, { owed: true })).status).toBe(403)
  const cleared = await dst.http.post(`/v1/moves/${first}/resend`, { owed: false })
  if (options.resendMark) expect(cleared.status).toBe(200)
  else expect([cleared.status, cleared.body.field]).toEqual([400, "owed"])
  expect((await stranger.http.post(`/v1/moves/${first}/resend`, { owed: false })).status).toBe(403)

  // A later move the first source took no part in: its read ends there.
  await moved(sid, dst, next)
  expect(await read(src, sid)).toEqual({ status: 403 })
  expect(await read(dst, sid)).toEqual({ status: 200, state: "running", hostId: next.id })
  expect(await read(next, sid)).toEqual({ status: 200, state: "running", hostId: next.id })

  // Ended (no host): the parties of its latest move still read it, and only they.
  expect((await admin.del(`/v1/sessions/${sid}`)).status).toBe(200)
  expect(await read(dst, sid)).toEqual({ status: 200, state: "ended", hostId: null })
  expect(await read(next, sid)).toEqual({ status: 200, state: "ended", hostId: null })
  expect(await read(src, sid)).toEqual({ status: 403 })
  expect(await read(stranger, sid)).toEqual({ status: 403 })
  // An unknown session is the 404 of the session, for a host as for the admin.
  expect((await stranger.http.get(`/v1/sessions/${uid("nope")}`)).status).toBe(404)
}
