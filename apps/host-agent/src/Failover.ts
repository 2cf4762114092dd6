/**
 * Several coordinator replicas behind one agent, without a proxy: which URLs it takes
 * (`ENGRAM_COORDINATOR_URL`, comma-separated), how long one call may take before the replica
 * counts as hung, which failures say "this replica is unreachable" (the agent moves to the next)
 * and which are the coordinator's answer (it stays), and the replica in use: one at a time
 * (sticky), the next in the list (round robin) when it is unreachable, switched once however
 * many calls fail on it at the same time.
 *
 * Why: a replica that hangs (SIGSTOP, a stuck VM, a network black hole) instead of dying keeps
 * every retry of an agent that knows only it; past the new leader's failover grace the host
 * looks dead and its sessions become `lost` although its guests run.
 */
import { Errors as ApiErrors } from "@engram/api"
import { Effect, Ref } from "effect"

/** Why a value of `ENGRAM_COORDINATOR_URL` is refused (`problem`), or its URLs in order. */
export type ParsedUrls = { readonly urls: readonly [string, ...string[]] } | { readonly problem: string }

const listRule = "must be one or more absolute http:// or https:// URLs, comma-separated"

/** A URL as the client uses it: no trailing slash (a path prefix is kept: `http://lb/engram/`). */
export const baseUrlOf = (url: string): string => url.replace(/\/+$/, "")

/**
 * Reads `ENGRAM_COORDINATOR_URL`: one URL, or several replicas' separated by commas (spaces
 * around them ignored), tried in that order. Each must be an absolute `http://` or `https://`
 * URL without `user:password@` (the host token authenticates, and URLs are logged); none empty,
 * none twice (compared as the client uses them: `http://a:7070/` is `http://a:7070`).
 */
export const parseUrls = (text: string): ParsedUrls => {
  const items = text.split(",").map((s) => s.trim())
  const seen = new Map<string, string>()
  for (const item of items) {
    if (item === "") return { problem: `${listRule}, none empty` }
    let parsed: URL
    try {
      parsed = new URL(item)
    } catch {
      return { problem: `${listRule} (${JSON.stringify(item)} is not one)` }
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") return { problem: `${listRule} (${JSON.stringify(item)} is not one)` }
    if (parsed.username !== "" || parsed.password !== "") return { problem: `${listRule}, without user:password@ (the host token authenticates)` }
    const key = baseUrlOf(parsed.href)
    const before = seen.get(key)
    if (before !== undefined) return { problem: `${listRule}, each once (${JSON.stringify(item)} repeats ${JSON.stringify(before)})` }
    seen.set(key, item)
  }
  return { urls: items as unknown as readonly [string, ...string[]] }
}

/** The shortest bound of one ordinary call, ms: below it a live coordinator on a busy machine (a GC pause, a slow store round trip) would be taken for a hung one. */
export const minCallTimeoutMs = 1_000

/** The longest bound of one ordinary call, ms: the agent's bound before replicas (a longer heartbeat interval does not lengthen it). */
export const maxCallTimeoutMs = 30_000

/**
 * How long one ordinary call (a heartbeat, a report, an acknowledgement) may take before its
 * replica counts as hung: the heartbeat interval, within [`minCallTimeoutMs`, `maxCallTimeoutMs`].
 * Why the interval: the last heartbeat answered at t, the next is sent by t + interval, times out
 * by t + 2 × interval and is tried at once on the next replica, so with the default interval (a
 * third of the stale window) a live replica has it a third of the window before the host is stale.
 */
export const callTimeoutMs = (heartbeatIntervalMs: number): number => Math.min(maxCallTimeoutMs, Math.max(minCallTimeoutMs, heartbeatIntervalMs))

/** How long an assignments long-poll of `waitMs` may take: the wait, plus one ordinary call's bound for the answer to arrive. */
export const pollTimeoutMs = (waitMs: number, callMs: number): number => waitMs + callMs

/** The gateway statuses a proxy or load balancer answers for a replica it cannot reach. */
const gatewayStatuses: ReadonlySet<number> = new Set([502, 503, 504])

/**
 * Whether a failed call says its replica is unreachable or hung, so the agent moves to the next:
 * no answer in time (`TimeoutError`), no answer at all (a refused or reset connection, DNS: the
 * client's `TransportError`), or a 502/503/504 that is not the API's own error (a proxy or load
 * balancer in front of that one replica answering for it).
 *
 * Also the API's own 503 `Unavailable`: this replica cannot reach the store (cut off from
 * PostgreSQL, its connections refused or its statements timed out). Another replica may reach it,
 * and one that stays would see its hosts reclaimed by a leader that does; when the database is
 * away for every replica, each answers the same and the call fails after one try on each, as
 * with one replica (the agent then waits what was asked).
 *
 * Everything else is the coordinator's answer, and another replica of the same database would
 * give the same one: a 4xx (a 401 refused token, a 403, a 404, a 409 `Conflict` the agent counts
 * as done), the API's 429 and its other 503s (`DiskFull`, a move's outcome; too many long-polls:
 * the coordinator asked to wait, the agent waits), a 500, an answer that does not decode. Moving
 * on those would only spread the same answer over every replica.
 */
export const unreachable = (e: { readonly _tag: string }): boolean => {
  if (e._tag === "TimeoutError") return true
  if (e._tag === "ServiceUnavailable") return (e as { readonly error?: unknown }).error === "Unavailable"
  if (Object.hasOwn(ApiErrors.statuses, e._tag)) return false
  const shaped = e as { readonly reason?: { readonly _tag?: string }; readonly response?: { readonly status?: number } }
  if (shaped.reason?._tag === "TransportError") return true
  const status = shaped.response?.status
  return status !== undefined && gatewayStatuses.has(status)
}

/** The replica in use: its index in the list, and the move to the next. */
export interface Sticky {
  readonly current: Effect.Effect<number>
  /**
   * Leaves replica `index` for the next in the list (round robin) if it is still the one in use
   * (compare-and-set): calls that failed on it at the same time switch once, and a call that
   * failed on a replica already left does not skip over the next. The index switched to, or
   * undefined when another call already switched.
   */
  readonly leave: (index: number) => Effect.Effect<number | undefined>
}

/** A sticky choice among `count` replicas, starting with the first. */
export const makeSticky = (count: number): Effect.Effect<Sticky> =>
  Effect.map(Ref.make(0), (ref) => ({
    current: Ref.get(ref),
    leave: (index) => Ref.modify(ref, (now): [number | undefined, number] => (now === index ? [(index + 1) % count, (index + 1) % count] : [undefined, now])),
  }))
