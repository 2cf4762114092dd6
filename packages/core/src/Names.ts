/**
 * The literal lists of engram's domain words that the core has as types but not as values:
 * what an API schema or a CLI enumerates. Each list must name every member of its union (a
 * member added to the union and missing here fails to compile).
 */
import type { HostState, NoFitReason } from "./Placement.js"
import type { YieldReason } from "./ParkGate.js"

/** Answers `list`, refusing at compile time a list that misses a member of `T`. */
const every =
  <T extends string>() =>
  <const L extends readonly T[]>(list: L & ([Exclude<T, L[number]>] extends [never] ? unknown : { readonly missing: Exclude<T, L[number]> })): readonly T[] =>
    list

/** Why a candidate host does not take a budget (SPEC §2). */
export const noFitReasons = every<NoFitReason>()(["unmeasured", "silent", "ram_full", "cpu_full", "entries_full", "cordoned", "draining", "fits_now"])

/** A host's administrative state. */
export const hostStates = every<HostState>()(["ready", "cordoned", "draining"])

/** Why the park gate yields a park (SPEC §4.1). */
export const yieldReasons = every<YieldReason>()(["demand", "over_reserved", "hard_ttl", "starving"])

/** A live move's state (SPEC §5). */
export type MoveState = "pending" | "committed" | "aborted"
/** Every move state. */
export const moveStates = every<MoveState>()(["pending", "committed", "aborted"])

/**
 * Who committed a move: its `source` (its commit with the phases it measured), its `target`'s
 * resolution (it runs the guest) or an `operator` (the admin's resolve, `engram moves commit`).
 */
export type MoveCommittedBy = "source" | "target" | "operator"
/** Every `MoveCommittedBy`. */
export const moveCommittedBy = every<MoveCommittedBy>()(["source", "target", "operator"])

/**
 * The kind of a move's record (SPEC §5): a pre-copy round (`full`, `delta`), the source's
 * `intent` (recorded with the guest still running: the next round is the final one, and the
 * target may run the guest once that stream is complete; it carries no figures), the `final` round.
 */
export type RoundKind = "full" | "delta" | "intent" | "final"
/** Every round kind, in the order a move records them. */
export const roundKinds = every<RoundKind>()(["full", "delta", "intent", "final"])

/** The longest id (SPEC §10, §12). */
export const idMaxLength = 100

/**
 * The one id rule (SPEC §10, §12) as a pattern and a length: 1–{@link idMaxLength} of
 * `[A-Za-z0-9._-]`, and not `.` or `..` (a path segment that names nothing). The pattern holds
 * the characters and the two names refused; the length is the JSON Schema's `minLength` and
 * `maxLength` beside it. It has no lookaround, so every JSON Schema reader takes it: ECMA-262
 * ones and RE2-based ones (Go's `regexp`, which refuses `(?!…)`) alike; and it is linear: its
 * first branch is leading dots, the first other character, then anything (a validator that
 * runs it before the length bound does not backtrack on a long string). An id of dots only has
 * at least three. The API's schemas publish this very pattern (`@engram/api`'s `Payloads.Id`)
 * and decode by it; the `u` flag is what lets effect export a pattern to JSON Schema.
 */
export const idPattern = /^(?:\.*[A-Za-z0-9_-][A-Za-z0-9._-]*|\.{3,})$/u

/**
 * The one id rule (SPEC §10, §12) for every id a client chooses — sessions, hosts,
 * reservations, moves: {@link idPattern}, 1–{@link idMaxLength} characters.
 */
export const isId = (value: unknown): value is string =>
  typeof value === "string" && value.length >= 1 && value.length <= idMaxLength && idPattern.test(value)

/**
 * The one rule for an integer read from text (a setting, a query string): decimal digits, an
 * optional sign, at most 15 digits (every such number is exact). `Number` alone also reads " "
 * as 0, "0x1F90" as 8080 and "1e3" as 1000.
 */
export const decimalInt = /^[+-]?[0-9]{1,15}$/

/** The rule of {@link decimalInt} in words, as a refusal that names no range of its own says it. */
export const decimalIntRule = "must be an integer of at most 15 decimal digits"

/** The longest reason a caller gives (a move's abort or resolve), characters: kept and shown in lists and logs. */
export const maxReasonLength = 4000

/** The id rule's words, as a refusal names it. */
/** The rule of a whole figure above zero (a budget's `memMib` and `vcpus`, a limit): the words every refusal of one uses. */
export const positiveIntegerRule = "must be an integer > 0"

/** Whether `value` is a whole figure above zero that a 64-bit column holds exactly. */
export const isPositiveInteger = (value: unknown): value is number => typeof value === "number" && Number.isSafeInteger(value) && value >= 1

/** Whether `text` holds a C0 control character or DEL (U+0000–U+001F, U+007F): refused in addresses (a peer URL, an agent's host). */
export const hasControlCharacter = (text: string): boolean => {
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (c < 0x20 || c === 0x7f) return true
  }
  return false
}

/**
 * Whether `host` is one host, as a listen address or an address built into URLs: a host name or
 * an IP address (an IPv6 one without brackets: URLs and `tcp:` URIs put them around it and a
 * port after it), and nothing else (no scheme, port, path, user, whitespace or control
 * character). Judged by the URL built from it: `http://<host>:1/` must parse with this host alone
 * before the port. A wildcard (0.0.0.0, ::) is one host here: it listens on every interface.
 * The one rule of the coordinator's `ENGRAM_HOST` and the agent's listen hosts.
 */
export const isHost = (host: string): boolean => {
  if (host === "" || host.startsWith("[") || /[\s/\\?#@]/.test(host) || hasControlCharacter(host)) return false
  try {
    const parsed = new URL(`http://${host.includes(":") ? `[${host}]` : host}:1/`)
    return parsed.hostname !== "" && parsed.port === "1" && parsed.pathname === "/"
  } catch {
    return false
  }
}

/** The rule of {@link isHost} in words, as a refusal says it. */
export const hostRule = "must be a host name or IP address (an IPv6 one without brackets), without a scheme, port, path, spaces or control characters"

export const idRule = "must be 1-100 characters of [A-Za-z0-9._-], and not . or .."

/** The rule of a reservation's `ownerId` in words (the store's `Validate` and the API's `Payloads.OwnerId`). */
export const ownerIdRule = "must be a non-empty string without NUL"

/**
 * The most hosts a session's affinity may name: a preference among a few hosts, not a list of the
 * fleet (as many as a host's labels). Every assignments answer and session record carries it.
 */
export const maxAffinityHosts = 64

/** The rule of a session's affinity as a whole: an array of at most {@link maxAffinityHosts} host ids (each by the id rule). */
export const affinityRule = `must be an array of at most ${maxAffinityHosts} host ids`

/**
 * Where a session's affinity first repeats a host (the list is an order of preference: a repeat
 * would say nothing but take room), as `[repeat, first]` indexes; null when each host is named once.
 */
export const affinityRepeat = (hosts: readonly string[]): readonly [number, number] | null => {
  const seen = new Map<string, number>()
  for (const [i, h] of hosts.entries()) {
    const first = seen.get(h)
    if (first !== undefined) return [i, first]
    seen.set(h, i)
  }
  return null
}

/** The rule a repeated affinity entry breaks, naming the entry it repeats (`affinity.<first>`). */
export const affinityRepeatRule = (first: number): string => `must name a host once (it repeats affinity.${first})`

/** The template name rule's words, as a refusal names it. */
export const templateNameRule = "must be 1-100 characters of [A-Za-z0-9._-], not starting with ."

/**
 * The one template name rule, for the API and every runtime: an id (`isId`) that does not start
 * with a dot, so a template's name is a plain file name next to the runtime's hidden build files.
 */
export const isTemplateName = (value: unknown): value is string => isId(value) && !value.startsWith(".")
