/**
 * Session lifetimes (SPEC §13): when a running session counts as idle (no reported guest
 * activity for its idle timeout), and when its TTL ends it whatever its state. The reaper asks
 * these; the stores only find the candidates (by an indexed read) and apply core's steps.
 */
import type { Record } from "./Session.js"

/** Why the reaper ends a session whose TTL passed (kept on its `Ended` event). */
export const ttlExpiredReason = "ttl expired"

/** The longest idle timeout or TTL: ten years, so every deadline stays an exact epoch-ms number. */
export const maxLifetimeMs = 10 * 365 * 24 * 60 * 60 * 1000

/** A lifetime option's rule, as a refusal names it. */
export const lifetimeRule = `must be an integer between 1 and ${maxLifetimeMs} (ms; 10 years)`

/** Whether `v` is a valid idle timeout or TTL (ms). */
export const validLifetimeMs = (v: unknown): v is number => typeof v === "number" && Number.isInteger(v) && v >= 1 && v <= maxLifetimeMs

/** When a session's TTL ends it: `ttlMs` after `now` (a create or an extension), or never (null). */
export const endsAtOf = (ttlMs: number | null | undefined, now: number): number | null => (ttlMs === null || ttlMs === undefined ? null : now + ttlMs)

/**
 * When a session with no further activity becomes idle: its idle timeout after its last
 * activity (or its last start to run), or never (null: no idle timeout).
 */
export const idleAt = (s: Pick<Record, "idleTimeoutMs">, lastActiveAt: number): number | null =>
  s.idleTimeoutMs === null ? null : lastActiveAt + s.idleTimeoutMs

/**
 * Whether a session is idle at `now`: running, with an idle timeout, and no activity since
 * `lastActiveAt` for that long. Only a running session becomes idle (a park is already idle).
 */
export const isIdle = (s: Pick<Record, "state" | "idleTimeoutMs">, lastActiveAt: number, now: number): boolean => {
  const at = idleAt(s, lastActiveAt)
  return s.state === "running" && at !== null && now >= at
}

/** Whether a session's TTL has ended it by `now`: any state but `ended`, with a deadline reached. */
export const isExpired = (s: Pick<Record, "state" | "endsAt">, now: number): boolean => s.state !== "ended" && s.endsAt !== null && now >= s.endsAt

/**
 * The least share of wall time a guest must have used the CPU for to count as active (1%):
 * an idle guest's timer ticks and housekeeping stay below it, any real work is above.
 */
export const minActiveCpuShare = 0.01

/**
 * Whether a guest was active between two readings of its CPU time `elapsedMs` apart: it used
 * at least `minActiveCpuShare` of that time. What the agent reports as activity.
 */
export const wasActive = (previousCpuMs: number, cpuMs: number, elapsedMs: number): boolean =>
  elapsedMs > 0 && cpuMs - previousCpuMs >= elapsedMs * minActiveCpuShare
