/**
 * Several coordinator replicas behind one client, without a proxy: which URLs a list takes
 * (the host agent's `ENGRAM_COORDINATOR_URL`, the CLI's `ENGRAM_URL`, comma-separated), and
 * which failures of a call say "this replica is unreachable" (try the next) rather than being
 * the coordinator's answer (another replica of the same database would give the same one).
 * The one place of these rules: the agent's `Failover` and `EngramClient` both use them.
 */
import { Errors as ApiErrors, Urls } from "@engram/api"

/** Why a list of coordinator URLs (`ENGRAM_COORDINATOR_URL`, `ENGRAM_URL`) is refused (`problem`), or its URLs in order. */
export type ParsedUrls = { readonly urls: readonly [string, ...string[]] } | { readonly problem: string }

const listRule = "must be one or more absolute http:// or https:// URLs, comma-separated"

/**
 * `value` (one URL or a comma-separated list) with what may hold a secret masked: `@engram/api`'s
 * `Urls.redact`, the one rule (the coordinator's URL settings show theirs by it too).
 */
export const redactUrl = Urls.redact

/** A URL as the client uses it: no trailing slash (a path prefix is kept: `http://lb/engram/`). */
export const baseUrlOf = (url: string): string => url.replace(/\/+$/, "")

/**
 * Reads a list of coordinator URLs (the agent's `ENGRAM_COORDINATOR_URL`, the CLI's `ENGRAM_URL`): one URL, or several replicas' separated by commas (spaces
 * around them ignored), tried in that order. Each must be an absolute `http://` or `https://`
 * URL without `user:password@` (the token authenticates, and URLs are logged); none empty,
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
    if (parsed.username !== "" || parsed.password !== "") return { problem: `${listRule}, without user:password@ (the token authenticates)` }
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

/** The gateway statuses a proxy or load balancer answers for a replica it cannot reach. */
const gatewayStatuses: ReadonlySet<number> = new Set([502, 503, 504])

/**
 * Whether a failed call says its replica is unreachable or hung, so the caller moves to the next:
 * no answer in time (`TimeoutError`), no answer at all (a refused or reset connection, DNS: the
 * client's `TransportError`), or a 502/503/504 that is not the API's own error (a proxy or load
 * balancer in front of that one replica answering for it).
 *
 * Also the API's own 503 `Unavailable`: this replica cannot reach the store (cut off from
 * PostgreSQL, its connections refused or its statements timed out). Not its 503 `StoreStalled`
 * (`storeStalled`): the database answers this replica but did not complete the call (a lock
 * held), which every replica of that database would answer too. Another replica may reach it,
 * and one that stays would see its hosts reclaimed by a leader that does; when the database is
 * away for every replica, each answers the same and the call fails after one try on each, as
 * with one replica (the agent then waits what was asked).
 *
 * So is a 503 `ReadOnly`: this replica's connections reach a database that only reads (a
 * standby after a failover); another replica may have reconnected to the new primary.
 *
 * Everything else is the coordinator's answer, and another replica of the same database would
 * give the same one: a 4xx (a 401 refused token, a 403, a 404, a 409 `Conflict` the agent counts
 * as done), the API's 429 and its other 503s (`DiskFull`, a move's outcome; too many long-polls:
 * the coordinator asked to wait, the agent waits), a 500, an answer that does not decode. Moving
 * on those would only spread the same answer over every replica.
 */
export const unreachable = (e: { readonly _tag: string }): boolean => {
  if (e._tag === "TimeoutError") return true
  if (e._tag === "ServiceUnavailable") {
    const error = (e as { readonly error?: unknown }).error
    return error === "Unavailable" || error === "ReadOnly"
  }
  if (Object.hasOwn(ApiErrors.statuses, e._tag)) return false
  const shaped = e as { readonly reason?: { readonly _tag?: string }; readonly response?: { readonly status?: number } }
  if (shaped.reason?._tag === "TransportError") return true
  const status = shaped.response?.status
  return status !== undefined && gatewayStatuses.has(status)
}

/**
 * Whether a failed call is the API's 503 `StoreStalled`: the coordinator's database answers but
 * did not complete the call within the caller's bound (a lock held, an overloaded server). The
 * same on every replica of that database: the caller stays (`unreachable` is false) and says so.
 */
export const storeStalled = (e: { readonly _tag: string }): boolean =>
  e._tag === "ServiceUnavailable" && (e as { readonly error?: unknown }).error === ApiErrors.storeStalledError

/**
 * Whether a failed call is the API's 503 `ReadOnly`: this replica's database refused the write
 * (a standby after a failover), so nothing was done, and another replica may have reconnected to
 * the new primary. A call not safe to repeat may move on after it (`neverReceived` aside).
 */
export const writeRefused = (e: { readonly _tag: string }): boolean =>
  e._tag === "ServiceUnavailable" && (e as { readonly error?: unknown }).error === "ReadOnly"

/** Codes of a connection that was never made: the request was not sent, so nothing was done. */
const notConnectedCodes = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH"])

/**
 * Whether a failed call was certainly never received (its connection was refused, or the name or
 * route not found): the one failure on which a call that is not safe to repeat, such as a move
 * or a reservation without an id (a create always carries an id: the client chooses one when the
 * caller gives none), may move to the next replica. A timeout, a reset connection, a gateway's answer
 * or the API's 503 `Unavailable` (a store call timed out: its write's outcome is unknown) may
 * follow a write that committed, and the next replica would do it again.
 */
export const neverReceived = (e: unknown): boolean => {
  const reason = (e as { readonly reason?: { readonly _tag?: string; readonly cause?: unknown } } | null)?.reason
  if (reason?._tag !== "TransportError") return false
  let cause: unknown = reason.cause
  for (let depth = 0; depth < 6 && cause !== undefined && cause !== null; depth++) {
    const c = cause as { readonly code?: unknown; readonly cause?: unknown; readonly errors?: readonly unknown[] }
    if (typeof c.code === "string" && notConnectedCodes.has(c.code)) return true
    // Node's fetch reports a host's several addresses' refusals as one AggregateError.
    if (Array.isArray(c.errors) && c.errors.length > 0 && c.errors.every((x) => notConnectedCodes.has(String((x as { readonly code?: unknown }).code)))) return true
    cause = c.cause
  }
  return false
}
