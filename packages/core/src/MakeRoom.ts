/**
 * Room made by moving running sessions (SPEC §5's live move as a policy action, issue 22): a
 * session that starves on a held host whose room its parks alone cannot make gets it from
 * running sessions moved off that host onto others. Pure: given the held host, the sessions
 * running there, the hosts that may take them and the costs of a move, `plan` answers which
 * sessions move where, or that moving cannot make the room. The caller starts the moves
 * (`Store.beginMove` with the chosen target); the ledger holds both hosts' RAM until each
 * commits.
 *
 * **Costs.** A move pre-copies the guest's resident RAM at `copyMibPerSec` while the guest keeps
 * dirtying it at `dirtyMibPerSec`; each round sends what the last one let the guest dirty, up to
 * `maxRounds`. The last round's bytes go into the downtime guard's own pre-pause estimate
 * (`Downtime.prePauseEstimateMs`, with the commit allowance); a session whose estimate passes
 * `maxDowntimeMs` is one the guard would refuse to switch over, so it is never chosen. The
 * allowance is the pair's learned one where the caller knows it (`Input.allowanceMs`, the
 * guard's `Downtime.pairAllowance`), else `costs.commitAllowanceMs`: a target whose pair's
 * allowance alone passes the budget takes no move.
 *
 * **Choice.** The fewest MiB moved, approximately: while the budget does not fit, the smallest
 * movable session that closes the remaining RAM gap (else the largest), each to the host where it
 * fits tightest (best fit, ties by id); then any chosen move whose absence still leaves the room
 * is dropped (largest first). A target must take moves (`Candidate.takesMoves`: its agent
 * advertises a peer URL): a move into a host its source cannot find would abort, then cool down.
 *
 * **Cooldown.** A session whose move ended aborted (its source's guard refused it, it timed out,
 * any abort) is not planned to move again, to any target, until `cooldownMs` after it ended
 * (`cooling`): plans are deterministic, so without it the next pass would begin the same doomed
 * move again, each one copying the session's whole RAM. The session, not the pair: what dooms
 * a move (the guest's dirty rate, a dead agent) mostly goes with the session, and best fit picks
 * another target as the fleet changes, so a pair rule could try it on every host in turn.
 *
 * **When.** A move changes where RAM is used, not how much: it only helps when the room the
 * queue waits for exists but is split over hosts (`roomIsSplit`). In an overloaded fleet it would
 * only let the starving session pass the others, the moved sessions taking room the queue's
 * next sessions needed, so the caller moves nothing there.
 */
import * as Downtime from "./Downtime.js"
import * as Headroom from "./Headroom.js"
import type { Budget } from "./Headroom.js"
import { defaults, type Limits } from "./Limits.js"
import { compareIds } from "./Order.js"
import type { FleetHost, FleetView } from "./ParkGate.js"
import * as ParkGate from "./ParkGate.js"
import * as Placement from "./Placement.js"
import type { Candidate } from "./Placement.js"
import { withReservation } from "./QueueWalk.js"

/** A session running on the held host, as a move would carry it. */
export interface Running {
  readonly sessionId: string
  /** Its reservation (what leaves the source and lands on the target). */
  readonly budget: Budget
  /** The RAM its guest touches: what a move copies. */
  readonly residentMib: number
}

/** What a move costs (the simulator's and the coordinator's figures). */
export interface Costs {
  /** A move's copy rate, MiB/s. */
  readonly copyMibPerSec: number
  /** How fast a running guest dirties its RAM during the copy, MiB/s. */
  readonly dirtyMibPerSec: number
  /** Pre-copy rounds before the final one (at least 1: the full copy). */
  readonly maxRounds: number
  /** The commit allowance the guard adds (SPEC §9 `commitAllowanceMs`). */
  readonly commitAllowanceMs: number
  /** The downtime a move may cost its session (the move's `maxDowntimeMs`). */
  readonly maxDowntimeMs: number
  /**
   * The longest pre-copy a move may take: one whose rounds would run longer is never chosen (a
   * move not past its point of no return in time is aborted, so it would copy for nothing and be
   * planned again). Missing: no bound.
   */
  readonly maxCopyMs?: number | undefined
}

/** 1 GiB/s copies (a 10 Gbit/s link), 64 MiB/s dirtied, 5 rounds, SPEC §9's 400 ms allowance, 1 s of downtime. */
export const defaultCosts: Costs = Object.freeze({
  copyMibPerSec: 1024,
  dirtyMibPerSec: 64,
  maxRounds: 5,
  commitAllowanceMs: defaults.commitAllowanceMs,
  maxDowntimeMs: 1000,
})

/** One move's figures under `Costs`. */
export interface Estimate {
  /** The pre-copy rounds' time (the session runs meanwhile). */
  readonly copyMs: number
  /** The final round's bytes (MiB) sent with the guest paused. */
  readonly finalMib: number
  /** The guard's pre-pause estimate: the pause the move costs its session. */
  readonly downtimeMs: number
  /** Whether the guard would let it switch over (`downtimeMs ≤ maxDowntimeMs`) and its pre-copy ends within `maxCopyMs`. */
  readonly allowed: boolean
}

const MiB = 1024 * 1024

/**
 * A move of `residentMib` under `costs`: rounds of pre-copy (the first the whole RAM, each next
 * what the guest dirtied meanwhile, at most `maxRounds`), then the guard's pre-pause estimate of
 * the final round. A rate that is not positive copies nothing: the estimate is infinite.
 */
export const estimate = (residentMib: number, costs: Costs): Estimate => {
  const rate = costs.copyMibPerSec
  if (!(rate > 0)) return { copyMs: Number.POSITIVE_INFINITY, finalMib: residentMib, downtimeMs: Number.POSITIVE_INFINITY, allowed: false }
  const rounds = Math.max(1, Math.floor(costs.maxRounds))
  let send = Math.max(0, residentMib)
  let copyMs = 0
  for (let k = 0; k < rounds; k++) {
    const ms = (send / rate) * 1000
    copyMs += ms
    // What the guest dirtied while this round ran, never more than its RAM.
    send = Math.min(Math.max(0, residentMib), (Math.max(0, costs.dirtyMibPerSec) * ms) / 1000)
  }
  const verdict = Downtime.check({
    lastDeltaWireBytes: send * MiB,
    rateBytesPerMs: (rate * MiB) / 1000,
    commitAllowanceMs: costs.commitAllowanceMs,
    maxDowntimeMs: costs.maxDowntimeMs,
  })
  const inTime = costs.maxCopyMs === undefined || copyMs <= costs.maxCopyMs
  return { copyMs, finalMib: send, downtimeMs: verdict.estimateMs, allowed: verdict._tag === "Fits" && inTime }
}

/** A move that ended aborted: its session and target, and when (epoch ms). */
export interface Aborted {
  readonly sessionId: string
  readonly targetHostId: string
  readonly endedAt: number
}

/** Ten minutes: a session whose move aborted is not planned to move again for this long. */
export const defaultCooldownMs = 10 * 60 * 1000

/** The aborted moves still cooling down at `now`: ended less than `cooldownMs` before it. */
export const cooling = (aborted: readonly Aborted[], now: number, cooldownMs: number = defaultCooldownMs): Aborted[] =>
  aborted.filter((a) => now - a.endedAt < cooldownMs)

/** One planned move. */
export interface Planned {
  readonly sessionId: string
  readonly fromHostId: string
  readonly toHostId: string
  readonly budget: Budget
  readonly estimate: Estimate
}

/** What `plan` reads. */
export interface Input {
  /** The budget to make room for. */
  readonly budget: Budget
  /** The held host, with its parks (they are counted as gone: the gate descends them for the budget). */
  readonly host: FleetHost
  /** The sessions running on it that may move (none with an open move). */
  readonly running: readonly Running[]
  /** Hosts that may take a moved session (the caller leaves out hosts held or claimed for others); one with `takesMoves: false` never does. */
  readonly targets: readonly Candidate[]
  /**
   * The guard's commit allowance of a move from the held host to each target (ms), by target id
   * (`Downtime.pairAllowance`); a target missing here: `costs.commitAllowanceMs`.
   */
  readonly allowanceMs?: ReadonlyMap<string, number> | undefined
  readonly costs?: Costs | undefined
  readonly limits?: Limits | undefined
  /** When the plan is decided (ms): a target silent then (`Placement.isSilent`) takes no move; missing: not judged. */
  readonly now?: number | undefined
}

/** The host with `budget` released from it (one entry fewer). */
const without = (c: FleetHost, budget: Budget): FleetHost => ({
  ...c,
  headroom: { ...c.headroom, reserved: Headroom.subtract(c.headroom.reserved, budget) },
  entries: Math.max(0, (c.entries ?? 0) - 1),
})

/** The best-fit target for `budget` among `targets` that take moves (the least RAM left after it, ties by id). */
const bestTarget = (
  targets: ReadonlyMap<string, Candidate>,
  budget: Budget,
  sourceId: string,
  limits: Limits,
  allowed: (c: Candidate) => boolean,
  now: number | undefined,
): Candidate | undefined => {
  let best: { c: Candidate; left: number } | undefined
  for (const c of targets.values()) {
    if (!Placement.admits(c, { budget, exclude: sourceId, takesMovesOnly: true, now }, limits) || !allowed(c) || (c.state ?? "ready") !== "ready" || !Placement.fitsOn(c, budget, limits)) continue
    const left = (Headroom.freeMib(c.headroom) ?? Number.POSITIVE_INFINITY) - budget.memMib
    if (best === undefined || left < best.left || (left === best.left && compareIds(c.id, best.c.id) < 0)) best = { c, left }
  }
  return best?.c
}

/**
 * The moves that make room for `budget` on the held host once its parks have descended: `[]`
 * when the parks alone make it (or it fits now), `null` when the movable sessions cannot (the
 * host could never take it, no target has room, or the guard would refuse the moves needed).
 * Every move lands on a target that has room for it after the moves planned before it; the
 * budget fits on the host once all of them have left; no move can be dropped.
 */
export const plan = (input: Input): Planned[] | null => {
  const limits = input.limits ?? defaults
  const costs = input.costs ?? defaultCosts
  const src = input.host
  if ((src.state ?? "ready") !== "ready" || !Placement.isMeasured(src)) return null
  if (!Placement.fitsOn(Placement.emptied(src), input.budget, { ...limits, requireMeasured: false })) return null
  let host: FleetHost = src
  for (const p of src.parks) host = without(host, p.budget)
  if (Placement.fitsOn(host, input.budget, limits)) return []

  // A session's estimate to a target: one per distinct allowance (most targets share the prior).
  const estimates = new Map<string, Estimate>()
  const estimateTo = (r: Running, targetId: string): Estimate => {
    const allowanceMs = input.allowanceMs?.get(targetId) ?? costs.commitAllowanceMs
    const key = `${r.sessionId}\u0000${allowanceMs}`
    let e = estimates.get(key)
    if (e === undefined) {
      e = estimate(r.residentMib, allowanceMs === costs.commitAllowanceMs ? costs : { ...costs, commitAllowanceMs: allowanceMs })
      estimates.set(key, e)
    }
    return e
  }
  const movable = [...input.running].sort((a, b) => a.budget.memMib - b.budget.memMib || compareIds(a.sessionId, b.sessionId))
  const targets = new Map(input.targets.filter((c) => c.id !== src.id).map((c) => [c.id, c]))
  const chosen: Planned[] = []
  const used = new Set<string>()
  while (!Placement.fitsOn(host, input.budget, limits)) {
    const gap = input.budget.memMib - (Headroom.freeMib(host.headroom) ?? Number.POSITIVE_INFINITY)
    // The smallest that closes the RAM gap, else the largest; only one that some target takes.
    let pick: { r: Running; to: Candidate } | undefined
    let largest: typeof pick
    for (const r of movable) {
      if (used.has(r.sessionId)) continue
      const to = bestTarget(targets, r.budget, src.id, limits, (c) => estimateTo(r, c.id).allowed, input.now)
      if (to === undefined) continue
      if (r.budget.memMib >= gap) {
        pick = { r, to }
        break
      }
      largest = { r, to }
    }
    pick ??= largest
    if (pick === undefined) return null
    used.add(pick.r.sessionId)
    host = without(host, pick.r.budget)
    targets.set(pick.to.id, withReservation(pick.to, pick.r.budget))
    chosen.push({ sessionId: pick.r.sessionId, fromHostId: src.id, toHostId: pick.to.id, budget: pick.r.budget, estimate: estimateTo(pick.r, pick.to.id) })
  }
  // Drop what is not needed, the largest first (dropping a move only frees its target).
  const kept = [...chosen]
  for (const c of [...chosen].sort((a, b) => b.budget.memMib - a.budget.memMib || compareIds(a.sessionId, b.sessionId))) {
    const back = withReservation(host, c.budget)
    if (Placement.fitsOn(back, input.budget, limits)) {
      host = back
      kept.splice(kept.indexOf(c), 1)
    }
  }
  return kept
}

/**
 * Whether the room the queue waits for exists in the fleet but split over hosts: the free RAM of
 * the ready measured hosts, with their parks counted as free (the gate descends them for the
 * queue), covers every queued session that some host could take (too-big ones left out).
 * Where it does not, the fleet lacks RAM, and moving sessions only reorders who waits.
 */
export const roomIsSplit = (fleet: FleetView, limits: Limits = defaults): boolean => {
  let free = 0
  for (const h of fleet.hosts) {
    if ((h.state ?? "ready") !== "ready" || !Placement.isMeasured(h) || !Headroom.gatesRam(h.headroom)) continue
    free += Math.max(0, Headroom.freeMib(h.headroom) as number)
    for (const p of h.parks) free += p.budget.memMib
  }
  const tooBig = new Set(ParkGate.unplaceable(fleet, limits).map((q) => q.sessionId))
  let wanted = 0
  for (const q of fleet.queue) if (!tooBig.has(q.sessionId)) wanted += q.budget.memMib
  return wanted <= free
}

/** What `forHolds` reads: the fleet as the pass left it, the gate's holds, what runs on the held hosts. */
export interface HoldsInput {
  /** The fleet after the pass (its descents started and its drain done). */
  readonly fleet: FleetView
  /** The gate's holds (`ParkGate.Decision.holds`); only the starving ones get moves. */
  readonly holds: readonly ParkGate.Hold[]
  /** The sessions running on each held host with no open move, by host id (a host missing runs none). */
  readonly running: ReadonlyMap<string, readonly Running[]>
  /** Hosts a move runs from: no second move starts there until it ends. */
  readonly movingFrom: ReadonlySet<string>
  /** The time of the fleet read (epoch ms): the claims of starving sessions are judged at it. */
  readonly now: number
  /** The gate's knobs (its starvation limit decides the claimed hosts moves keep off). */
  readonly gate: ParkGate.Options
  /** At most this many moves in the answer (the first ones, in the holds' order). */
  readonly maxMoves: number
  /** Moves that ended aborted: the session of one still cooling down at `now` is not planned to move. */
  readonly aborted?: readonly Aborted[] | undefined
  /** How long an aborted move cools down (ms); `defaultCooldownMs` when missing. */
  readonly cooldownMs?: number | undefined
  /** The learned commit allowance of each pair, by source host id then target id (`Input.allowanceMs`); missing: the prior. */
  readonly allowanceMs?: ReadonlyMap<string, ReadonlyMap<string, number>> | undefined
  readonly costs?: Costs | undefined
  readonly limits?: Limits | undefined
}

/**
 * The starving holds moves may serve now: the held host runs no descent and no move (the room
 * they make is waited for first), while the room is split (`roomIsSplit`). The caller reads the
 * running sessions of these hosts only.
 */
export const servable = (fleet: FleetView, holds: readonly ParkGate.Hold[], movingFrom: ReadonlySet<string>, limits: Limits = defaults): ParkGate.Hold[] => {
  if (!holds.some((h) => h.reason === "starving") || !roomIsSplit(fleet, limits)) return []
  const byId = new Map(fleet.hosts.map((h) => [h.id, h]))
  return holds.filter((h) => h.reason === "starving" && !movingFrom.has(h.hostId) && byId.get(h.hostId)?.descentsRunning === 0)
}

/**
 * The moves of one reaper pass (the simulator's `--moves` and the coordinator's
 * `ENGRAM_MAKE_ROOM_MOVES`): for each servable starving hold in order, `plan` on its host, the
 * targets every host but those held or claimed (`ParkGate.claimedHosts`) for a session, the
 * sessions whose moves aborted still cooling down left out; the
 * fleet then counts each planned move's target reservation (as `Store.beginMove` takes it), so
 * the next hold's plan and `roomIsSplit` see it. Stops when the room is no longer split, and
 * answers at most `maxMoves` moves: a hold whose plan passes the bound gets its first moves now
 * (its host then runs a move, so the rest are planned again once they end).
 */
export const forHolds = (input: HoldsInput): Planned[] => {
  const limits = input.limits ?? defaults
  const max = Math.max(0, Math.floor(input.maxMoves))
  const out: Planned[] = []
  let fleet = input.fleet
  const resting = new Set(cooling(input.aborted ?? [], input.now, input.cooldownMs ?? defaultCooldownMs).map((a) => a.sessionId))
  // What each hold's plan is judged on changes only with the fleet, when a plan takes moves: the
  // room is split (`servable` found it so for the fleet as given) and the hosts fenced off (held
  // or claimed: the claims walk the whole queue over every host) are found again only then.
  let split = true
  let fenced: Set<string> | undefined
  for (const hold of servable(fleet, input.holds, input.movingFrom, limits)) {
    if (out.length >= max) break
    // Moves only where the room exists but is split: in an overloaded fleet they only reorder who waits.
    if (!split) break
    const q = fleet.queue.find((x) => x.sessionId === hold.sessionId)
    const held = fleet.hosts.find((x) => x.id === hold.hostId)
    if (q === undefined || held === undefined) continue
    if (fenced === undefined) {
      fenced = new Set(input.holds.map((x) => x.hostId))
      for (const c of ParkGate.claimedHosts(fleet, input.now, limits, input.gate).values()) fenced.add(c.id)
    }
    const fence = fenced
    const running = (input.running.get(hold.hostId) ?? []).filter((r) => !resting.has(r.sessionId))
    const planned = plan({ budget: q.budget, host: held, running, targets: fleet.hosts.filter((x) => !fence.has(x.id)), allowanceMs: input.allowanceMs?.get(hold.hostId), costs: input.costs, limits, now: input.now })
    if (planned === null || planned.length === 0) continue
    const taken = planned.slice(0, max - out.length)
    out.push(...taken)
    const reserved = new Map<string, Budget[]>()
    for (const m of taken) reserved.set(m.toHostId, [...(reserved.get(m.toHostId) ?? []), m.budget])
    fleet = {
      ...fleet,
      hosts: fleet.hosts.map((h) => (reserved.get(h.id) ?? []).reduce((acc: FleetHost, b) => withReservation(acc, b), h)),
    }
    split = roomIsSplit(fleet, limits)
    fenced = undefined
  }
  return out
}
