/**
 * A real coordinator in this process (StoreSim behind real HTTP) and the agent's side of the
 * API, driven by hand over HTTP: register and report hosts, acknowledge starts, find a move's
 * assignment, as a host agent would. `fleet(adminToken)` answers the helpers for one token.
 */
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"

/** The store's default limits but a stale window of a day (see `start`). */
const handReported = { ...StoreSim.make().store.limits(), heartbeatStaleWindowMs: 24 * 60 * 60 * 1000 }

/** An answer: its status and its JSON body (null when empty). */
export interface Answer {
  readonly status: number
  readonly body: any // eslint-disable-line @typescript-eslint/no-explicit-any
}

/** The helpers of one test file, all calling with `adminToken`. */
export const fleet = (adminToken: string) => {
  /** One JSON call with the admin token; answers the status and body. */
  const call = async (base: string, method: string, path: string, body?: unknown): Promise<Answer> => {
    const res = await fetch(`${base}${path}`, {
      method,
      headers: { authorization: `Bearer ${adminToken}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    })
    const text = await res.text()
    return { status: res.status, body: text === "" ? null : JSON.parse(text) }
  }

  /**
   * A coordinator on the in-memory store, reaper off (tests drive what they need). Its hosts are
   * reported by hand, once: a stale window of a day keeps them from going silent (a host not heard
   * from within the window takes no placements) in a test file a loaded machine stretches past
   * the default two minutes.
   */
  const start = (): Promise<RunningCoordinator> =>
    startCoordinator({ store: StoreSim.layer({ limits: handReported }), reaper: false, logLevel: "Error", config: { port: 0, adminToken } })

  /** Registers a host and reports its size (a measured, ready host). */
  const addHost = async (base: string, id: string, totalMib: number, totalVcpus: number): Promise<void> => {
    const created = await call(base, "POST", "/v1/hosts", { id })
    if (created.status !== 201) throw new Error(`register ${id}: ${created.status} ${JSON.stringify(created.body)}`)
    // The capacity after policy is (allocatable - 1024 reserve): report the reserve on top.
    const reported = await call(base, "PUT", `/v1/hosts/${id}/report`, { totalMib: totalMib + 1024, allocatableMib: totalMib + 1024, totalVcpus })
    if (reported.status !== 200) throw new Error(`report ${id}: ${reported.status} ${JSON.stringify(reported.body)}`)
  }

  /** The agent's acknowledgement that a placed session's VM runs. */
  const started = async (base: string, id: string): Promise<void> => {
    const r = await call(base, "POST", `/v1/sessions/${id}/started`)
    if (r.status !== 200) throw new Error(`started ${id}: ${r.status} ${JSON.stringify(r.body)}`)
  }

  /** The pending move of a session, as its source agent's assignments show it (waits until it is there). */
  const pendingMove = async (base: string, sourceHostId: string, sessionId: string): Promise<{ id: string }> => {
    for (;;) {
      const a = await call(base, "GET", `/v1/hosts/${sourceHostId}/assignments?waitMs=2000`)
      const move = (a.body?.moves ?? []).find((m: { sessionId: string; state: string }) => m.sessionId === sessionId && m.state === "pending")
      if (move !== undefined) return move as { id: string }
    }
  }

  return { adminToken, call, start, addHost, started, pendingMove }
}

let n = 0
/** A unique id within a run. */
export const uid = (prefix: string): string => `${prefix}-${Date.now().toString(36)}-${(n++).toString(36)}`
