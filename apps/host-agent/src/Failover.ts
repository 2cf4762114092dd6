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

/**
 * `value` (one URL or a comma-separated list) with what may hold a secret masked, for an echoed
 * refused value or a log line: any user information (everything before the last `@` of the
 * authority, as `new URL` reads it) and any query or fragment.
 */
export const redactUrl = (value: string): string =>
  value
    .split(",")
    .map((item) => {
      const scheme = item.indexOf("//")
      const start = scheme < 0 ? 0 : scheme + 2
      // Not a URL at all but with an `@` (a password holding a `/`, say): nothing after the scheme is shown.
      if (item.includes("@") && !URL.canParse(item.trim())) return `${item.slice(0, start)}***`
      const rest = item.slice(start)
      // The authority ends at the path, query or fragment (whichever comes first).
      const end = rest.search(/[/?#]/)
      const authority = end < 0 ? rest : rest.slice(0, end)
      const tail = end < 0 ? "" : rest.slice(end)
      const at = authority.lastIndexOf("@")
      const host = at < 0 ? authority : `***@${authority.slice(at + 1)}`
      const cut = tail.search(/[?#]/)
      const path = cut < 0 ? tail : `${tail.slice(0, cut)}${tail[cut]}***`
      return item.slice(0, start) + host + path
    })
    .join(",")

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
      return { problem: `${listRule} (${JSON.stringify(redactUrl(item))} is not one)` }
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") return { problem: `${listRule} (${JSON.stringify(redactUrl(item))} is not one)` }
    if (parsed.username !== "" || parsed.password !== "") return { problem: `${listRule}, without user:password@ (the host token authenticates)` }
    // A query or a fragment has no place in a base URL, and URLs are logged (a token there would be too).
    if (parsed.search !== "" || parsed.hash !== "" || item.includes("?") || item.includes("#"))
      return { problem: `${listRule}, without a query or fragment (${JSON.stringify(redactUrl(item))} has one)` }
    const key = baseUrlOf(parsed.href)
    const before = seen.get(key)
    if (before !== undefined) return { problem: `${listRule}, each once (${JSON.stringify(redactUrl(item))} repeats ${JSON.stringify(redactUrl(before))})` }
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

/**
 * How long an assignments long-poll of `waitMs` may take: the wait, plus one ordinary call's bound
 * and at least 15 s (the margin before replicas) for the answer to arrive: the coordinator reads the
 * store before it starts to wait and may read again after a late wake-up, so a live but busy
 * replica answers a little past the wait. A hung replica is found by the heartbeat's shorter bound.
 * With one URL (`urlCount` 1) the margin is 15 s, as before replicas.
 */
export const pollTimeoutMs = (waitMs: number, callMs: number, urlCount = 2): number => waitMs + (urlCount > 1 ? Math.max(callMs, pollMarginMs) : pollMarginMs)

/** The least margin of a long-poll past its wait, ms (`pollTimeoutMs`). */
export const pollMarginMs = 15_000

/**
 * The bound of one ordinary call for an agent given `urlCount` URLs: with one there is nowhere
 * else to go, so a shorter bound would only fail slow answers (the 30 s before replicas); with
 * several, `callTimeoutMs` of the heartbeat interval.
 */
export const callTimeoutFor = (urlCount: number, heartbeatIntervalMs: number): number =>
  urlCount > 1 ? callTimeoutMs(heartbeatIntervalMs) : maxCallTimeoutMs

/**
 * The replica an agent starts on: one drawn from its host id (FNV-1a), so a fleet given the same
 * list spreads over the replicas instead of all starting on the first.
 */
export const startIndex = (hostId: string, count: number): number => {
  let h = 0x811c9dc5
  for (let i = 0; i < hostId.length; i++) h = Math.imul(h ^ hostId.charCodeAt(i), 0x01000193)
  return (h >>> 0) % Math.max(1, count)
}

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

/** A sticky choice among `count` replicas, starting with replica `start`. */
export const makeSticky = (count: number, start = 0): Effect.Effect<Sticky> =>
  Effect.map(Ref.make(start), (ref) => ({
    current: Ref.get(ref),
    leave: (index) => Ref.modify(ref, (now): [number | undefined, number] => (now === index ? [(index + 1) % count, (index + 1) % count] : [undefined, now])),
  }))
