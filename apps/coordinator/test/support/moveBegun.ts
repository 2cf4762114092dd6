// The scene of the tests of a move's end over real HTTP (`operator-commit`, `committed-by`): hosts
// registered and reported, a session started on one, a move of it to another begun.
import { expect } from "vitest"
import { client, uid } from "./http.js"
import type { Answer } from "./http.js"

/** A host registered through the coordinator at `url` and reported (`report`) now; its id and token. */
export const reportedHost = async (url: string, adminToken: string, report: Record<string, unknown>): Promise<{ readonly id: string; readonly token: string }> => {
  const admin = client(url, adminToken)
  const id = uid("h")
  const created = await admin.post("/v1/hosts", { id })
  expect(created.status).toBe(201)
  expect((await admin.put(`/v1/hosts/${id}/report`, report)).status).toBe(200)
  return { id, token: created.body.token as string }
}

/**
 * A session started on `src` and a move of it to `dst` begun by the admin (the move request's
 * answer not awaited: `answer`), its id read from the source's assignments as its agent would.
 */
export const moveBegun = async (
  url: string,
  adminToken: string,
  src: { readonly id: string; readonly token: string },
  dst: { readonly id: string },
): Promise<{ readonly sid: string; readonly moveId: string; readonly answer: Promise<Answer> }> => {
  const admin = client(url, adminToken)
  const sid = uid("s")
  expect((await admin.post("/v1/sessions", { id: sid, memMib: 256, vcpus: 1, affinity: [src.id] })).body.hostId).toBe(src.id)
  const source = client(url, src.token)
  await source.post(`/v1/sessions/${sid}/started`)
  const answer = admin.post(`/v1/sessions/${sid}/move`, { targetHostId: dst.id, maxDowntimeMs: 600 })
  let moveId: string | undefined
  for (let i = 0; i < 100 && moveId === undefined; i++) {
    const a = await source.get(`/v1/hosts/${src.id}/assignments`)
    moveId = (a.body.moves as { id: string; sessionId: string }[]).find((m) => m.sessionId === sid)?.id
    if (moveId === undefined) await new Promise((r) => setTimeout(r, 20))
  }
  if (moveId === undefined) throw new Error("the move never showed up")
  return { sid, moveId, answer }
}
