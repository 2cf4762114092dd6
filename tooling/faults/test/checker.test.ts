// The checker itself: fed a history and an observation that break one rule each, it names that
// rule (and only it); fed a clean one, it finds nothing. A checker that cannot fail proves nothing.
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { Checker } from "../src/index.js"
import type { HostSums, Observation, StoredReservation } from "../src/Checker.js"
import type { GuestEvent, Op } from "../src/History.js"

let clock = 0
const op = (kind: Op["kind"], id: string, status: number | null): Op => ({
  kind,
  id,
  method: kind === "end" ? "DELETE" : "POST",
  path: kind === "end" ? `/v1/sessions/${id}` : "/v1/sessions",
  body: kind === "create" ? { id, memMib: 512, vcpus: 1 } : undefined,
  status,
  response: status === null ? "TypeError: fetch failed" : {},
  retryAfter: null,
  startMs: clock++,
  endMs: clock++,
})
const host = (id: string, reservedMib: number, entries: number, capacityMib: number | null = 4096): HostSums => ({
  id,
  capacityMib,
  cpuBudget: 32,
  reservedMib,
  reservedVcpus: entries,
  entries,
})
const room = (sessionId: string, hostId: string, memMib = 512): StoredReservation => ({
  id: `r-${sessionId}-${hostId}`,
  hostId,
  ownerKind: "session",
  ownerId: sessionId,
  memMib,
  vcpus: 1,
})

/** A clean run: s1 placed on h1, s2 created then ended, s3 failed with a 503 and not stored. */
const clean = (): { history: Op[]; observation: Observation } => ({
  history: [op("create", "s1", 201), op("create", "s2", 201), op("create", "s3", 503), op("end", "s2", 200)],
  observation: {
    sessions: [
      { id: "s1", state: "pending", hostId: "h1" },
      { id: "s2", state: "ended", hostId: null },
    ],
    hosts: [host("h1", 512, 1), host("h2", 0, 0)],
    reservations: [room("s1", "h1")],
  },
})

const rules = (history: readonly Op[], observation: Observation) => Checker.check(history, observation).map((v) => v.rule)

describe("the checker over a recorded history", () => {
  it("finds nothing in a clean run", () => {
    const { history, observation } = clean()
    expect(Checker.check(history, observation)).toEqual([])
  })

  it("an acknowledged create that is not stored is reported", () => {
    const { history, observation } = clean()
    expect(rules(history, { ...observation, sessions: observation.sessions.filter((s) => s.id !== "s1"), reservations: [], hosts: [host("h1", 0, 0), host("h2", 0, 0)] })).toEqual([
      "acknowledged_create_missing",
    ])
  })

  it("an acknowledged create stored twice is reported", () => {
    const { history, observation } = clean()
    expect(rules(history, { ...observation, sessions: [...observation.sessions, { id: "s1", state: "queued", hostId: null }] })).toEqual(["stored_twice"])
  })

  it("a create that failed with a 5xx or no answer may be stored once, never twice", () => {
    const history = [op("create", "s9", null), op("create", "s9", 503)]
    const once: Observation = { sessions: [{ id: "s9", state: "queued", hostId: null }], hosts: [], reservations: [] }
    expect(rules(history, once)).toEqual([])
    expect(rules(history, { ...once, sessions: [...once.sessions, ...once.sessions] })).toEqual(["stored_twice"])
  })

  it("a create refused with a 4xx that is stored anyway is reported", () => {
    expect(rules([op("create", "bad", 400)], { sessions: [{ id: "bad", state: "queued", hostId: null }], hosts: [], reservations: [] })).toEqual(["refused_create_stored"])
  })

  it("an acknowledged end whose session is not ended, or still holds room, is reported", () => {
    const { history, observation } = clean()
    const notEnded = { ...observation, sessions: observation.sessions.map((s) => (s.id === "s2" ? { ...s, state: "running", hostId: "h2" } : s)) }
    expect(rules(history, notEnded)).toEqual(["ended_session_not_ended"])
    const holds = { ...observation, reservations: [...observation.reservations, room("s2", "h2")], hosts: [host("h1", 512, 1), host("h2", 512, 1)] }
    expect(rules(history, holds)).toEqual(["ended_session_holds_room", "runs_elsewhere"])
  })

  it("a host over capacity in any sample is reported once, with the sample", () => {
    const { history, observation } = clean()
    const samples = [
      { atMs: 10, hosts: [host("h1", 4096, 8)] },
      { atMs: 11, hosts: [host("h1", 4608, 9)] },
      { atMs: 12, hosts: [host("h1", 5120, 10)] },
    ]
    const found = Checker.check(history, { ...observation, samples })
    expect(found.map((v) => v.rule)).toEqual(["over_capacity"])
    expect(found[0]?.detail).toContain("reserved 4608 MiB > capacity 4096 MiB (sample at 11)")
  })

  it("final reservations beyond a host's capacity are reported; an ungated host is never over", () => {
    const rooms = Array.from({ length: 9 }, (_, i) => room(`s${i}`, "h1"))
    const sessions = rooms.map((r) => ({ id: r.ownerId, state: "pending", hostId: "h1" }))
    expect(rules([], { sessions, hosts: [host("h1", 4608, 9)], reservations: rooms })).toEqual(["over_capacity"])
    expect(rules([], { sessions, hosts: [host("h1", 4608, 9, null)], reservations: rooms })).toEqual([])
  })

  it("maintained sums that differ from the reservations are reported, also for a host holding none", () => {
    const { history, observation } = clean()
    expect(rules(history, { ...observation, hosts: [host("h1", 1024, 1), host("h2", 0, 0)] })).toEqual(["sums_mismatch"])
    expect(rules(history, { ...observation, hosts: [host("h1", 512, 1), host("h2", 0, 1)] })).toEqual(["sums_mismatch"])
    expect(rules(history, { ...observation, hosts: [host("h1", 512, 1)], reservations: [...observation.reservations, { ...room("x", "h9"), ownerKind: "external" }] })).toEqual([
      "sums_mismatch",
    ])
  })

  it("a session with two reservations, or running on two agents, runs twice", () => {
    const { history, observation } = clean()
    const two = { ...observation, reservations: [room("s1", "h1"), room("s1", "h2")], hosts: [host("h1", 512, 1), host("h2", 512, 1)] }
    expect(rules(history, two)).toEqual(["runs_twice", "runs_elsewhere"])
    const agents = { ...observation, running: [{ hostId: "h1", sessionIds: ["s1"] }, { hostId: "h2", sessionIds: ["s1"] }] }
    expect(rules(history, agents)).toEqual(["runs_twice", "runs_elsewhere"])
  })

  it("a session an agent still runs after the store lost or ended it is reported", () => {
    const { history, observation } = clean()
    expect(rules(history, { ...observation, running: [{ hostId: "h1", sessionIds: ["s1"] }] })).toEqual([])
    const lost = { ...observation, sessions: [{ id: "s1", state: "lost", hostId: "h1" }, observation.sessions[1]!], reservations: [], hosts: [host("h1", 0, 0), host("h2", 0, 0)] }
    expect(rules(history, { ...lost, running: [{ hostId: "h1", sessionIds: ["s1"] }] })).toEqual(["runs_elsewhere"])
  })

  it("any set of reservations within capacity, summed as maintained, passes; one more MiB than capacity fails", () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 1, max: 1024 }), { maxLength: 12 }), (sizes) => {
        const rooms = sizes.map((m, i) => room(`p${i}`, "h1", m))
        const sessions = rooms.map((r) => ({ id: r.ownerId, state: "pending", hostId: "h1" }))
        const total = sizes.reduce((a, b) => a + b, 0)
        const history = sessions.map((s) => op("create", s.id, 201))
        const exact = { sessions, reservations: rooms, hosts: [{ ...host("h1", total, sizes.length), capacityMib: total }] }
        expect(Checker.check(history, exact)).toEqual([])
        if (sizes.length > 0) expect(rules(history, { ...exact, hosts: [{ ...host("h1", total, sizes.length), capacityMib: total - 1 }] })).toEqual(["over_capacity"])
      }),
    )
  })

  describe("no guest reported running is destroyed without an end or abort", () => {
    const running = (hostId: string, atMs: number): GuestEvent => ({ kind: "guest_running", hostId, sessionId: "s1", atMs })
    const destroyed = (hostId: string, atMs: number): GuestEvent => ({ kind: "guest_destroyed", hostId, sessionId: "s1", atMs })
    const move = (kind: "move_committed" | "move_aborted", atMs: number): GuestEvent => ({ kind, moveId: "m1", sessionId: "s1", sourceHostId: "h1", targetHostId: "h2", atMs })
    const { history, observation } = clean()
    const destroys = (guests: GuestEvent[], ops: readonly Op[] = history) => Checker.check(ops, observation, guests).filter((v) => v.rule === "destroyed_without_end")

    it("a destroy after a running report with no end or abort names the session and the host", () => {
      const found = destroys([running("h1", 10), destroyed("h1", 20)])
      expect(found.map((v) => v.id)).toEqual(["s1"])
      expect(found[0]!.detail).toContain("h1")
    })

    it("an end, the move's commit (on the source) or its abort (on the target) before the destroy lets it go", () => {
      expect(destroys([running("h1", 10), { kind: "session_ended", sessionId: "s1", atMs: 15 }, destroyed("h1", 20)])).toEqual([])
      expect(destroys([running("h1", 10), destroyed("h1", 20)], [...history, { ...op("end", "s1", null), startMs: 12 }])).toEqual([])
      expect(destroys([running("h1", 10), move("move_committed", 15), destroyed("h1", 20)])).toEqual([])
      expect(destroys([running("h2", 10), move("move_aborted", 15), destroyed("h2", 20)])).toEqual([])
      // A guest never reported running (a copy still being received) may go without one.
      expect(destroys([destroyed("h2", 20)])).toEqual([])
    })

    it("an outcome that drops the other copy, or comes after the destroy, or an end refused, does not", () => {
      expect(destroys([running("h2", 10), move("move_committed", 15), destroyed("h2", 20)]).map((v) => v.id)).toEqual(["s1"])
      expect(destroys([running("h1", 10), move("move_aborted", 15), destroyed("h1", 20)]).map((v) => v.id)).toEqual(["s1"])
      expect(destroys([running("h1", 10), destroyed("h1", 20), { kind: "session_ended", sessionId: "s1", atMs: 25 }]).map((v) => v.id)).toEqual(["s1"])
      expect(destroys([running("h1", 10), destroyed("h1", 20)], [...history, { ...op("end", "s1", 404), startMs: 12 }]).map((v) => v.id)).toEqual(["s1"])
    })
  })
})
