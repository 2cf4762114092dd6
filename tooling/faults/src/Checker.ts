/**
 * The checker over a recorded history: what must hold after any fault, whatever the fault did to
 * the answers. Pure: it reads the client's operations (`History.Op`) and what the store and the
 * agents held (an `Observation`), and answers every violation it finds, each naming its rule.
 *
 * - every acknowledged create is stored exactly once; a create that failed with a 5xx or no
 *   answer is stored at most once; a create refused with a 4xx is not stored;
 * - an acknowledged end left the session `ended`, holding no reservation;
 * - no host was ever over capacity: in every sample of the store's reads and in the final
 *   reservations, the reserved RAM (and vCPUs) of a gated host is within its capacity;
 * - the maintained per-host sums equal the sums of the host's reservations;
 * - nothing runs twice: a session holds at most one session reservation, on its own host, and
 *   runs on at most one agent, the one the store places it on;
 * - no guest an agent reported running was destroyed there without an explicit end of its session
 *   or an outcome of a move that lets that host drop it (a commit drops the source's copy, an abort
 *   the target's), recorded before the destroy was seen.
 */
import { acknowledged, type GuestEvent, indeterminate, type Op } from "./History.js"

/** A session as the store lists it (one item per row the listing answered: duplicates kept). */
export interface StoredSession {
  readonly id: string
  readonly state: string
  readonly hostId: string | null
}

/** A host's capacity after policy (null: not gated) and its maintained reservation sums. */
export interface HostSums {
  readonly id: string
  readonly capacityMib: number | null
  readonly cpuBudget: number | null
  readonly reservedMib: number
  readonly reservedVcpus: number
  readonly entries: number
}

/** One reservation as the store holds it. */
export interface StoredReservation {
  readonly id: string
  readonly hostId: string
  readonly ownerKind: string
  readonly ownerId: string
  readonly memMib: number
  readonly vcpus: number
}

/** One read of every host's reserved room taken while the load ran. */
export interface Sample {
  readonly atMs: number
  readonly hosts: readonly HostSums[]
}

/** What the store (and the agents) held once the scenario was over. */
export interface Observation {
  readonly sessions: readonly StoredSession[]
  readonly hosts: readonly HostSums[]
  readonly reservations: readonly StoredReservation[]
  /** Reads taken during the run; the final state counts as one more. */
  readonly samples?: readonly Sample[]
  /** The sessions each agent says it runs (only when agents ran). */
  readonly running?: readonly { readonly hostId: string; readonly sessionIds: readonly string[] }[]
}

/** The rules a violation can break. */
export type Rule =
  | "acknowledged_create_missing"
  | "stored_twice"
  | "refused_create_stored"
  | "ended_session_not_ended"
  | "ended_session_holds_room"
  | "over_capacity"
  | "sums_mismatch"
  | "runs_twice"
  | "runs_elsewhere"
  | "destroyed_without_end"

/** One thing that must not have happened, with what shows it. */
export interface Violation {
  readonly rule: Rule
  readonly id: string
  readonly detail: string
}

// Reservation figures are doubles summed in numeric: compare with a tolerance for rounding only.
const EPSILON = 1e-6

/** Every violation of the rules above in `history` and `observation` (empty: all hold). */
export const check = (history: readonly Op[], observation: Observation, guests: readonly GuestEvent[] = []): Violation[] => {
  const violations: Violation[] = []
  const stored = new Map<string, StoredSession[]>()
  for (const s of observation.sessions) stored.set(s.id, [...(stored.get(s.id) ?? []), s])

  // Creates: per id, what the client was told decides how many copies may be stored.
  const creates = new Map<string, Op[]>()
  for (const op of history) if (op.kind === "create" && op.id !== null) creates.set(op.id, [...(creates.get(op.id) ?? []), op])
  for (const [id, ops] of creates) {
    const count = stored.get(id)?.length ?? 0
    if (ops.some(acknowledged)) {
      if (count === 0) violations.push({ rule: "acknowledged_create_missing", id, detail: `create acknowledged with ${statuses(ops)} but the session is not stored` })
      else if (count > 1) violations.push({ rule: "stored_twice", id, detail: `create acknowledged; the session is stored ${count} times` })
    } else if (ops.some(indeterminate)) {
      if (count > 1) violations.push({ rule: "stored_twice", id, detail: `create failed (${statuses(ops)}); the session is stored ${count} times` })
    } else if (count > 0) {
      violations.push({ rule: "refused_create_stored", id, detail: `create refused with ${statuses(ops)} but the session is stored` })
    }
  }
  // Sessions the client never created may still be stored more than once.
  for (const [id, copies] of stored) {
    if (!creates.has(id) && copies.length > 1) violations.push({ rule: "stored_twice", id, detail: `the session is stored ${copies.length} times` })
  }

  // Ends: an acknowledged end is final and frees the session's room.
  const sessionRooms = new Map<string, StoredReservation[]>()
  for (const r of observation.reservations) {
    if (r.ownerKind === "session") sessionRooms.set(r.ownerId, [...(sessionRooms.get(r.ownerId) ?? []), r])
  }
  for (const op of history) {
    if (op.kind !== "end" || op.id === null || !acknowledged(op)) continue
    const copies = stored.get(op.id) ?? []
    for (const s of copies) {
      if (s.state !== "ended") violations.push({ rule: "ended_session_not_ended", id: op.id, detail: `end acknowledged (${op.status}) but the session is ${s.state}` })
    }
    const rooms = sessionRooms.get(op.id) ?? []
    if (rooms.length > 0) violations.push({ rule: "ended_session_holds_room", id: op.id, detail: `end acknowledged but it holds ${rooms.map((r) => `${r.id}@${r.hostId}`).join(", ")}` })
  }

  // Capacity: every sample, and the final reservations summed per host.
  const computed = sumsByHost(observation.reservations)
  const finalSample: Sample = {
    atMs: Number.POSITIVE_INFINITY,
    hosts: observation.hosts.map((h) => {
      const c = computed.get(h.id)
      return { ...h, reservedMib: c?.memMib ?? 0, reservedVcpus: c?.vcpus ?? 0, entries: c?.entries ?? 0 }
    }),
  }
  const overSeen = new Set<string>()
  for (const sample of [...(observation.samples ?? []), finalSample]) {
    for (const h of sample.hosts) {
      const over =
        h.capacityMib !== null && h.reservedMib > h.capacityMib + EPSILON
          ? `reserved ${h.reservedMib} MiB > capacity ${h.capacityMib} MiB`
          : h.cpuBudget !== null && h.cpuBudget > 0 && h.reservedVcpus > h.cpuBudget + EPSILON
            ? `reserved ${h.reservedVcpus} vCPUs > budget ${h.cpuBudget}`
            : null
      // One violation per host is enough to read; the first sample that shows it is named.
      if (over !== null && !overSeen.has(h.id)) {
        overSeen.add(h.id)
        violations.push({ rule: "over_capacity", id: h.id, detail: `${over} (${Number.isFinite(sample.atMs) ? `sample at ${sample.atMs}` : "final reservations"})` })
      }
    }
  }

  // Maintained sums against the reservations they sum.
  for (const h of observation.hosts) {
    const c = computed.get(h.id) ?? { memMib: 0, vcpus: 0, entries: 0 }
    if (Math.abs(h.reservedMib - c.memMib) > EPSILON || Math.abs(h.reservedVcpus - c.vcpus) > EPSILON || h.entries !== c.entries) {
      violations.push({
        rule: "sums_mismatch",
        id: h.id,
        detail: `maintained {memMib: ${h.reservedMib}, vcpus: ${h.reservedVcpus}, entries: ${h.entries}} ≠ reservations {memMib: ${c.memMib}, vcpus: ${c.vcpus}, entries: ${c.entries}}`,
      })
    }
  }
  const known = new Set(observation.hosts.map((h) => h.id))
  for (const [hostId, c] of computed) {
    if (!known.has(hostId)) violations.push({ rule: "sums_mismatch", id: hostId, detail: `${c.entries} reservations on a host the store does not list` })
  }

  // Nothing runs twice: one session reservation, on the session's own host; one agent runs it.
  for (const [sessionId, rooms] of sessionRooms) {
    if (rooms.length > 1) violations.push({ rule: "runs_twice", id: sessionId, detail: `${rooms.length} session reservations: ${rooms.map((r) => `${r.id}@${r.hostId}`).join(", ")}` })
    const hostId = stored.get(sessionId)?.[0]?.hostId ?? null
    for (const r of rooms) {
      if (hostId !== r.hostId) violations.push({ rule: "runs_elsewhere", id: sessionId, detail: `its reservation ${r.id} is on ${r.hostId}, the session on ${hostId ?? "no host"}` })
    }
  }
  const runningOn = new Map<string, string[]>()
  for (const a of observation.running ?? []) for (const id of a.sessionIds) runningOn.set(id, [...(runningOn.get(id) ?? []), a.hostId])
  for (const [sessionId, hosts] of runningOn) {
    if (hosts.length > 1) violations.push({ rule: "runs_twice", id: sessionId, detail: `runs on ${hosts.join(" and ")}` })
    const s = stored.get(sessionId)?.[0]
    const placedOn = s !== undefined && ["pending", "running", "parked", "descending", "moving"].includes(s.state) ? s.hostId : null
    for (const h of hosts) {
      if (h !== placedOn) violations.push({ rule: "runs_elsewhere", id: sessionId, detail: `runs on ${h}; the store has it ${s === undefined ? "nowhere" : `${s.state} on ${s.hostId ?? "no host"}`}` })
    }
  }
  violations.push(...checkDestroys(history, guests))
  return violations
}

/**
 * Destroys without an end or abort: a guest an agent reported running, later gone from that
 * agent, needs its session's end (a `DELETE` the client sent, acknowledged or not, or a recorded
 * end) or the outcome of a move that drops that copy, at or before the destroy was seen.
 */
export const checkDestroys = (history: readonly Op[], guests: readonly GuestEvent[]): Violation[] => {
  const violations: Violation[] = []
  const endsAt = (sessionId: string): number[] => [
    ...history.filter((op) => op.kind === "end" && op.id === sessionId && (acknowledged(op) || indeterminate(op))).map((op) => op.startMs),
    ...guests.flatMap((e) => (e.kind === "session_ended" && e.sessionId === sessionId ? [e.atMs] : [])),
  ]
  const dropsAt = (sessionId: string, hostId: string): number[] =>
    guests.flatMap((e) =>
      (e.kind === "move_committed" && e.sessionId === sessionId && e.sourceHostId === hostId) || (e.kind === "move_aborted" && e.sessionId === sessionId && e.targetHostId === hostId)
        ? [e.atMs]
        : [],
    )
  for (const d of guests) {
    if (d.kind !== "guest_destroyed") continue
    const ran = guests.some((e) => e.kind === "guest_running" && e.hostId === d.hostId && e.sessionId === d.sessionId && e.atMs <= d.atMs)
    if (!ran) continue
    const justified = [...endsAt(d.sessionId), ...dropsAt(d.sessionId, d.hostId)].some((at) => at <= d.atMs)
    if (!justified) {
      violations.push({
        rule: "destroyed_without_end",
        id: d.sessionId,
        detail: `reported running on ${d.hostId}, destroyed there (seen at ${d.atMs}) with no end of the session and no move outcome that drops it there`,
      })
    }
  }
  return violations
}

/** The sums of each host's reservations. */
export const sumsByHost = (reservations: readonly StoredReservation[]): Map<string, { memMib: number; vcpus: number; entries: number }> => {
  const sums = new Map<string, { memMib: number; vcpus: number; entries: number }>()
  for (const r of reservations) {
    const s = sums.get(r.hostId) ?? { memMib: 0, vcpus: 0, entries: 0 }
    sums.set(r.hostId, { memMib: s.memMib + r.memMib, vcpus: s.vcpus + r.vcpus, entries: s.entries + 1 })
  }
  return sums
}

/** One line per violation, for a test's failure message. */
export const describe = (violations: readonly Violation[]): string =>
  violations.length === 0 ? "no violations" : violations.map((v) => `${v.rule} ${v.id}: ${v.detail}`).join("\n")

const statuses = (ops: readonly Op[]): string => ops.map((o) => (o.status === null ? "no answer" : String(o.status))).join(", ")
