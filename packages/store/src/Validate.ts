/**
 * Input rules shared by every backend, so a bad id or budget is refused with the same field
 * and rule whichever store runs. Each check answers the first broken rule, or null.
 */
import type { Budget } from "@engram/core"
import { Downtime, Ledger, Lifetime, Move, Names } from "@engram/core"
import { InvalidInput } from "./Errors.js"
import type { HostReport, MoveGuardReport, NumberedRound } from "./Types.js"

/** The id rule's words, as a refusal names it (core's `Names.idRule`). */
export const idRule = Names.idRule

/**
 * The one id rule (SPEC §10, §12) for every id a client chooses — sessions, hosts,
 * reservations: 1–100 of `[A-Za-z0-9._-]`, and not `.` or `..` (a path segment that names
 * nothing). Ids the store makes itself (reservations of placements, moves) keep to it too.
 */
export const id = (field: string, value: unknown): InvalidInput | null => (Names.isId(value) ? null : new InvalidInput({ field, rule: idRule }))

// Every figure must fit the stores' 64-bit columns exactly: past 2^53 - 1 a number is not exact.
const MAX = Number.MAX_SAFE_INTEGER

const integerAtLeast = (field: string, value: unknown, min: number): InvalidInput | null =>
  typeof value !== "number" || !Number.isInteger(value) || value < min
    ? new InvalidInput({ field, rule: min === 1 ? Names.positiveIntegerRule : `must be an integer >= ${min}` })
    : value > MAX
      ? new InvalidInput({ field, rule: `must be <= ${MAX}` })
      : null

const finiteAtLeastZero = (field: string, value: unknown): InvalidInput | null =>
  typeof value !== "number" || !Number.isFinite(value) || value < 0
    ? new InvalidInput({ field, rule: "must be a finite number >= 0" })
    : value > MAX
      ? new InvalidInput({ field, rule: `must be <= ${MAX}` })
      : null

// A high surrogate not followed by a low one, or a low one not preceded by a high one.
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/

/**
 * Free text (labels, descriptions, reasons, filters): any string without a
 * NUL character, which PostgreSQL text cannot hold, and without a lone surrogate, which UTF-8
 * cannot encode (it would be stored as U+FFFD: what is stored is what was sent, or nothing).
 */
export const text = (field: string, value: unknown): InvalidInput | null =>
  typeof value !== "string"
    ? new InvalidInput({ field, rule: "must be a string" })
    : value.includes("\u0000")
      ? new InvalidInput({ field, rule: "must not contain a NUL character" })
      : LONE_SURROGATE.test(value)
        ? new InvalidInput({ field, rule: "must not contain a lone surrogate (text must be valid Unicode)" })
        : null

/** What the coordinator may put before a caller's reason ("resolved by <who>: "), characters. */
export const reasonPrefixAllowance = 200

/** The longest reason a store keeps (a move's abort, a session's end), characters: a caller's (`Names.maxReasonLength`) and what the coordinator adds. */
export const maxReasonLength = Names.maxReasonLength + reasonPrefixAllowance

/** A reason: text of at most {@link maxReasonLength} characters (shown in lists and logs). */
export const reason = (value: unknown): InvalidInput | null =>
  text("reason", value) ?? ((value as string).length > maxReasonLength ? new InvalidInput({ field: "reason", rule: `must be at most ${maxReasonLength} characters` }) : null)

/** A lost guest's report (`Store.recordGuestLost`): its host's id, and a reason that says something. */
export const guestLost = (hostId: unknown, reasonText: unknown): InvalidInput | null =>
  id("hostId", hostId) ?? reason(reasonText) ?? ((reasonText as string).trim() === "" ? new InvalidInput({ field: "reason", rule: "must not be empty" }) : null)

/** An optional filter (`?hostId=`): absent, or text. */
export const filter = (field: string, value: unknown): InvalidInput | null => (value === undefined ? null : text(field, value))

/** A host pair filter: host ids as text, `recordedSince` absent or a finite number (a time before the epoch selects every pair). */
export const pairFilter = (f: { readonly sourceHostId?: unknown; readonly targetHostId?: unknown; readonly recordedSince?: unknown }): InvalidInput | null =>
  filter("sourceHostId", f.sourceHostId) ??
  filter("targetHostId", f.targetHostId) ??
  (f.recordedSince === undefined || (typeof f.recordedSince === "number" && Number.isFinite(f.recordedSince))
    ? null
    : new InvalidInput({ field: "recordedSince", rule: "must be a finite number (epoch ms)" }))

/** The most commits of each group `listAllowanceCommits` may be asked for. */
export const maxAllowanceLimit = 1000

/** An allowance commits query: host ids as text, `recordedSince` a finite number, `limit` an integer from 1 to {@link maxAllowanceLimit}. */
export const allowanceCommitsQuery = (q: { readonly sourceHostId: unknown; readonly targetHostIds: unknown; readonly recordedSince: unknown; readonly limit: unknown }): InvalidInput | null =>
  text("sourceHostId", q.sourceHostId) ??
  (Array.isArray(q.targetHostIds) ? (q.targetHostIds as unknown[]).reduce<InvalidInput | null>((bad, t) => bad ?? text("targetHostIds", t), null) : new InvalidInput({ field: "targetHostIds", rule: "must be an array of strings" })) ??
  (typeof q.recordedSince === "number" && Number.isFinite(q.recordedSince) ? null : new InvalidInput({ field: "recordedSince", rule: "must be a finite number (epoch ms)" })) ??
  (integerAtLeast("limit", q.limit, 1) ?? (typeof q.limit === "number" && q.limit > maxAllowanceLimit ? new InvalidInput({ field: "limit", rule: `must be <= ${maxAllowanceLimit}` }) : null))

/** The most rows of each kind one `pruneHistory` call may be asked to delete. */
export const maxPruneLimit = 10_000

/** A move filter (`listMoves`, `pageMoves`): `hostId` absent or text, `endedSince` absent or a finite number (epoch ms). */
export const moveFilter = (f: { readonly hostId?: unknown; readonly endedSince?: unknown }): InvalidInput | null =>
  filter("hostId", f.hostId) ??
  (f.endedSince === undefined || (typeof f.endedSince === "number" && Number.isFinite(f.endedSince))
    ? null
    : new InvalidInput({ field: "endedSince", rule: "must be a finite number (epoch ms)" }))

/**
 * A prune request at `nowMs`: `endedBefore` an integer >= 0 and not after now (history ends in
 * the past: a cutoff in the future is a caller's mistake), `limit` an integer from 1 to
 * {@link maxPruneLimit} (each call is a bounded chunk).
 */
export const pruneRequest = (r: unknown, nowMs: number): InvalidInput | null => {
  if (typeof r !== "object" || r === null) return new InvalidInput({ field: "endedBefore", rule: "must be an integer >= 0 (epoch ms)" })
  const { endedBefore, limit } = r as { readonly endedBefore?: unknown; readonly limit?: unknown }
  return (
    (typeof endedBefore !== "number" || !Number.isInteger(endedBefore) || endedBefore < 0 || endedBefore > MAX
      ? new InvalidInput({ field: "endedBefore", rule: "must be an integer >= 0 (epoch ms)" })
      : endedBefore > nowMs
        ? new InvalidInput({ field: "endedBefore", rule: `must not be after now (${nowMs})` })
        : null) ??
    integerAtLeast("limit", limit, 1) ??
    ((limit as number) > maxPruneLimit ? new InvalidInput({ field: "limit", rule: `must be <= ${maxPruneLimit}` }) : null)
  )
}

/** A session budget: `memMib` an integer > 0, `vcpus` an integer > 0. */
export const budget = (b: Budget): InvalidInput | null => integerAtLeast("memMib", b.memMib, 1) ?? integerAtLeast("vcpus", b.vcpus, 1)

/** An optional session lifetime (`idleTimeoutMs`, `ttlMs`): absent, or core's `Lifetime.lifetimeRule`. */
export const lifetime = (field: string, value: unknown): InvalidInput | null =>
  value === undefined || Lifetime.validLifetimeMs(value) ? null : new InvalidInput({ field, rule: Lifetime.lifetimeRule })

/**
 * A reservation's expiry asked relative to now (`expiresInMs`, the API's): absent, or core's
 * lifetime rule, and not beside an `expiresAt` (one expiry, said once). The caller turns it into
 * `expiresAt` on the store's time (`nowOf`), so a client's clock does not set it.
 */
export const expiresIn = (input: { readonly expiresAt?: unknown; readonly expiresInMs?: unknown }): InvalidInput | null =>
  input.expiresInMs !== undefined && input.expiresAt !== undefined
    ? new InvalidInput({ field: "expiresInMs", rule: "must not be given with expiresAt: one expiry, absolute (expiresAt) or from now (expiresInMs)" })
    : lifetime("expiresInMs", input.expiresInMs)

/** A new TTL (`setTtl`): required, by the same rule. */
export const ttl = (value: unknown): InvalidInput | null =>
  Lifetime.validLifetimeMs(value) ? null : new InvalidInput({ field: "ttlMs", rule: Lifetime.lifetimeRule })

/** The most sessions one activity report may name. */
export const maxActivitySessions = 10_000

/** The sessions an agent reports active: an array of session ids (the id rule), at most `maxActivitySessions`. */
export const activity = (value: unknown): InvalidInput | null => {
  if (!Array.isArray(value) || value.length > maxActivitySessions)
    return new InvalidInput({ field: "activeSessions", rule: `must be an array of at most ${maxActivitySessions} session ids` })
  for (const [i, x] of value.entries()) {
    const bad = id(`activeSessions.${i}`, x)
    if (bad) return bad
  }
  return null
}

/** An optional template name: absent, or core's one rule (`Names.isTemplateName`). */
export const template = (value: unknown): InvalidInput | null =>
  value === undefined || Names.isTemplateName(value) ? null : new InvalidInput({ field: "template", rule: Names.templateNameRule })

/** The most hosts a session's affinity may name (core's `Names.maxAffinityHosts`, which the API's schema publishes too). */
export const maxAffinityHosts = Names.maxAffinityHosts

/** The rule of a session's affinity as a whole (core's `Names.affinityRule`). */
export const affinityRule = Names.affinityRule

/**
 * A session's affinity: absent, or at most {@link maxAffinityHosts} host ids (the id rule), each
 * once (core's `Names.affinityRepeat`: the list is an order of preference, a repeat says nothing).
 */
export const affinity = (value: unknown): InvalidInput | null => {
  if (value === undefined) return null
  if (!Array.isArray(value) || value.length > maxAffinityHosts) return new InvalidInput({ field: "affinity", rule: affinityRule })
  for (const [i, a] of value.entries()) {
    if (typeof a !== "string") return new InvalidInput({ field: "affinity", rule: affinityRule })
    // A host id by the id rule: an entry no host can have would be kept and never matched.
    const badId = id(`affinity.${i}`, a)
    if (badId) return badId
  }
  const repeat = Names.affinityRepeat(value as readonly string[])
  return repeat === null ? null : new InvalidInput({ field: `affinity.${repeat[0]}`, rule: Names.affinityRepeatRule(repeat[1]) })
}

/** A new session: its id, budget and affinity list (`affinity`), its lifetimes and template, and what to do without room. */
export const sessionInput = (input: {
  id: unknown
  budget: Budget
  affinity?: unknown
  onNoRoom?: unknown
  idleTimeoutMs?: unknown
  ttlMs?: unknown
  template?: unknown
}): InvalidInput | null => {
  const bad =
    id("id", input.id) ??
    budget(input.budget) ??
    lifetime("idleTimeoutMs", input.idleTimeoutMs) ??
    lifetime("ttlMs", input.ttlMs) ??
    template(input.template) ??
    affinity(input.affinity)
  if (bad) return bad
  return input.onNoRoom === undefined || input.onNoRoom === "queue" || input.onNoRoom === "refuse"
    ? null
    : new InvalidInput({ field: "onNoRoom", rule: "must be one of queue, refuse" })
}

/** The most labels a host may carry, and the longest key and value. */
export const maxLabels = 64
export const maxLabelKeyLength = 100
export const maxLabelValueLength = 1000

// Control characters (C0, DEL, C1): a label is shown in tables and logs, where they would forge lines.
const CONTROL = /\p{Cc}/u

/**
 * A new host: its id and labels, at most {@link maxLabels}: each key 1-{@link maxLabelKeyLength}
 * characters, each value at most {@link maxLabelValueLength}, both text without control characters.
 */
export const hostInput = (input: { id: unknown; labels?: unknown }): InvalidInput | null => {
  const bad = id("id", input.id)
  if (bad) return bad
  if (input.labels === undefined) return null
  if (typeof input.labels !== "object" || input.labels === null || Array.isArray(input.labels))
    return new InvalidInput({ field: "labels", rule: "must be an object of string values" })
  const entries = Object.entries(input.labels)
  if (entries.length > maxLabels) return new InvalidInput({ field: "labels", rule: `must hold at most ${maxLabels} labels` })
  for (const [k, v] of entries) {
    if (typeof v !== "string") return new InvalidInput({ field: "labels", rule: "must be an object of string values" })
    const badText = text("labels", k) ?? text("labels", v)
    if (badText) return badText
    const field = `labels.${k}`
    if (k.length === 0 || k.length > maxLabelKeyLength) return new InvalidInput({ field, rule: `a label key must be 1-${maxLabelKeyLength} characters` })
    if (v.length > maxLabelValueLength) return new InvalidInput({ field, rule: `a label value must be at most ${maxLabelValueLength} characters` })
    if (CONTROL.test(k) || CONTROL.test(v)) return new InvalidInput({ field, rule: "a label key or value must not contain a control character" })
  }
  return null
}

/**
 * A host report: each figure null or a finite number >= 0; `totalVcpus` an integer; and a
 * host cannot offer more RAM than it has (`allocatableMib` <= `totalMib` when both are reported);
 * its templates and its peer URL by their own rules.
 */
export const report = (r: HostReport): InvalidInput | null => {
  for (const field of ["totalMib", "allocatableMib"] as const) {
    const v = r[field]
    if (v !== null) {
      const bad = finiteAtLeastZero(field, v)
      if (bad) return bad
    }
  }
  if (r.totalMib !== null && r.allocatableMib !== null && r.allocatableMib > r.totalMib)
    return new InvalidInput({ field: "allocatableMib", rule: `must be <= totalMib (${r.totalMib})` })
  return (r.totalVcpus === null ? null : integerAtLeast("totalVcpus", r.totalVcpus, 0)) ?? heldTemplates(r.templates) ?? peerUrl(r.peerUrl)
}

/** The longest peer URL a host may advertise (core's `Move.maxPeerUrlLength`). */
export const maxPeerUrlLength = Move.maxPeerUrlLength

/** The rule of a host's advertised peer URL (`peerUrl`): null, or core's `Move.peerUrlRule` (a wildcard host such as 0.0.0.0 is no peer URL). */
export const peerUrlRule = `must be null or ${Move.peerUrlRule}`

/**
 * A host's advertised peer URL: absent, null, or an absolute http(s) URL naming a host a peer can
 * reach (no wildcard). No credentials, query or fragment: move sources log it and authenticate
 * with the move token, never with the URL.
 * Kept as sent (not normalized): what is stored is what the agent advertised.
 */
export const peerUrl = (value: unknown): InvalidInput | null =>
  value === undefined || value === null || (typeof value === "string" && Move.isPeerUrl(value)) ? null : new InvalidInput({ field: "peerUrl", rule: peerUrlRule })

/** The most templates one host report may list. */
export const maxReportedTemplates = 1000

/** The templates a host reports: absent, or at most `maxReportedTemplates`, each a template name (once) with a size of integers > 0. */
export const heldTemplates = (value: unknown): InvalidInput | null => {
  if (value === undefined) return null
  if (!Array.isArray(value) || value.length > maxReportedTemplates)
    return new InvalidInput({ field: "templates", rule: `must be an array of at most ${maxReportedTemplates} templates` })
  const seen = new Set<string>()
  for (const [i, t] of value.entries()) {
    if (typeof t !== "object" || t === null || Array.isArray(t)) return new InvalidInput({ field: `templates.${i}`, rule: "must be an object {name, memMib, vcpus}" })
    const { name, memMib, vcpus } = t as { name?: unknown; memMib?: unknown; vcpus?: unknown }
    if (!Names.isTemplateName(name)) return new InvalidInput({ field: `templates.${i}.name`, rule: Names.templateNameRule })
    if (seen.has(name)) return new InvalidInput({ field: `templates.${i}.name`, rule: "must be unique within the report" })
    seen.add(name)
    const bad = integerAtLeast(`templates.${i}.memMib`, memMib, 1) ?? integerAtLeast(`templates.${i}.vcpus`, vcpus, 1)
    if (bad) return bad
  }
  return null
}

const finiteAboveZero = (field: string, value: unknown): InvalidInput | null =>
  typeof value !== "number" || !Number.isFinite(value) || value <= 0
    ? new InvalidInput({ field, rule: "must be a finite number > 0" })
    : value > MAX
      ? new InvalidInput({ field, rule: `must be <= ${MAX}` })
      : null

/** A move's budget: `maxDowntimeMs` finite, > 0 and exact. */
export const maxDowntimeMs = (v: unknown): InvalidInput | null => finiteAboveZero("maxDowntimeMs", v)

/** The estimate an abort records: absent, or a finite number >= 0. */
export const estimateMs = (v: unknown): InvalidInput | null => (v === undefined ? null : finiteAtLeastZero("estimateMs", v))

/** A source guard's report: figures finite and >= 0, a known source, a whole number of samples (0 for the prior). */
export const guard = (g: MoveGuardReport): InvalidInput | null => {
  for (const field of ["allowanceMs", "estimateMs"] as const) {
    const bad = finiteAtLeastZero(`guard.${field}`, g[field])
    if (bad) return bad
  }
  if (!Downtime.allowanceSources.includes(g.allowanceSource))
    return new InvalidInput({ field: "guard.allowanceSource", rule: `must be one of ${Downtime.allowanceSources.join(", ")}` })
  if (!Number.isSafeInteger(g.allowanceSamples) || g.allowanceSamples < 0)
    return new InvalidInput({ field: "guard.allowanceSamples", rule: "must be an integer >= 0" })
  return g.allowanceSource === "prior" && g.allowanceSamples !== 0
    ? new InvalidInput({ field: "guard.allowanceSamples", rule: "must be 0 for the prior" })
    : null
}

/** A pre-copy round: a known kind, every figure finite and >= 0, and its position, if any, an integer >= 0. */
export const round = (r: NumberedRound): InvalidInput | null => {
  if (r.seq !== undefined && (!Number.isSafeInteger(r.seq) || r.seq < 0))
    return new InvalidInput({ field: "seq", rule: "must be an integer >= 0 (the count of the move's records before this one)" })
  if (r.kind !== "full" && r.kind !== "delta" && r.kind !== "intent" && r.kind !== "final")
    return new InvalidInput({ field: "kind", rule: "must be one of full, delta, intent, final" })
  for (const field of ["wireBytes", "apparentBytes", "sendMs", "captureMs"] as const) {
    const bad = finiteAtLeastZero(field, r[field])
    if (bad) return bad
    if (r.kind === "intent" && r[field] !== 0) return new InvalidInput({ field, rule: "must be 0 for an intent (it carries no figures)" })
  }
  return null
}

/** The owner kind of a reservation. */
export const ownerKind = (v: unknown): InvalidInput | null =>
  typeof v === "string" && (Ledger.ownerKinds as readonly string[]).includes(v)
    ? null
    : new InvalidInput({ field: "ownerKind", rule: `must be one of ${Ledger.ownerKinds.join(", ")}` })

/**
 * The shape of a reservation request, before the ledger's checks: a given id and host id follow
 * the id rule, the empty string included (a missing one, absent or null, is the ledger's
 * `id_missing` or `host_missing`; a malformed one is bad input, not a reserve failure, and no
 * host can have it), figures fit exactly, `vramMib` >= 0,
 * `expiresAt` finite and not already passed at `now` (an entry expired on arrival would be
 * reclaimed by the next pass: core's `Ledger.isExpired` decides), `ownerId` and `description` text.
 */
export const reserveExtras = (
  r: {
    id?: unknown
    hostId?: unknown
    memMib?: unknown
    vcpus?: unknown
    vramMib?: unknown
    expiresAt?: unknown
    description?: unknown
    ownerId?: unknown
  },
  now: number,
): InvalidInput | null =>
  (r.id == null ? null : id("id", r.id)) ??
  (r.hostId == null ? null : id("hostId", r.hostId)) ??
  (typeof r.memMib === "number" && Math.abs(r.memMib) > MAX ? new InvalidInput({ field: "memMib", rule: `must be <= ${MAX}` }) : null) ??
  (typeof r.vcpus === "number" && Math.abs(r.vcpus) > MAX ? new InvalidInput({ field: "vcpus", rule: `must be <= ${MAX}` }) : null) ??
  (typeof r.ownerId === "string" && r.ownerId.length > 0 && text("ownerId", r.ownerId) === null
    ? null
    : new InvalidInput({ field: "ownerId", rule: Names.ownerIdRule })) ??
  (r.vramMib == null ? null : finiteAtLeastZero("vramMib", r.vramMib)) ??
  (r.expiresAt == null || (typeof r.expiresAt === "number" && Number.isFinite(r.expiresAt) && Math.abs(r.expiresAt) <= MAX)
    ? null
    : new InvalidInput({ field: "expiresAt", rule: `must be epoch milliseconds (a finite number, at most ${MAX})` })) ??
  (typeof r.expiresAt === "number" && Ledger.isExpired({ expiresAt: r.expiresAt }, now)
    ? new InvalidInput({ field: "expiresAt", rule: `must not be in the past (now is ${now} epoch ms)` })
    : null) ??
  (r.description == null ? null : text("description", r.description))

/**
 * A committed move's phases (SPEC §5, §12): each a finite figure > 0 (a phase of no time was
 * not measured), and capture + send + commit within the downtime they are parts of.
 */
export const phases = (p: { downtimeMs: number; captureMs: number; sendMs: number; commitMs: number }): InvalidInput | null => {
  for (const field of ["downtimeMs", "captureMs", "sendMs", "commitMs"] as const) {
    const bad = finiteAboveZero(field, p[field])
    if (bad) return bad
  }
  return p.captureMs + p.sendMs + p.commitMs <= p.downtimeMs
    ? null
    : new InvalidInput({ field: "downtimeMs", rule: "must be >= captureMs + sendMs + commitMs" })
}

/** Who commits a move (`commitMove`'s `by`): absent, or one of core's `Names.moveCommittedBy`. */
export const committedBy = (by: unknown): InvalidInput | null =>
  by == null || Names.moveCommittedBy.includes(by as Move.CommittedBy)
    ? null
    : new InvalidInput({ field: "by", rule: `must be one of ${Names.moveCommittedBy.join(", ")}` })

/** The resend mark's clears a source's tell saw (`markResendOwed`'s `seenClears`): absent, or an integer >= 0. */
export const seenClears = (n: unknown): InvalidInput | null =>
  n === undefined || (typeof n === "number" && Number.isSafeInteger(n) && n >= 0) ? null : new InvalidInput({ field: "seenClears", rule: "must be an integer >= 0" })

/** The default number of items of a page. */
export const defaultPageLimit = 100
/** The most items a page may hold. */
export const maxPageLimit = 1000

/** A page request: `limit` absent or an integer from 1 to 1000 (the cursor is checked by `Cursor.decode`). */
export const pageLimit = (limit: unknown): InvalidInput | null =>
  limit === undefined || (typeof limit === "number" && Number.isInteger(limit) && limit >= 1 && limit <= maxPageLimit)
    ? null
    : new InvalidInput({ field: "limit", rule: `must be an integer from 1 to ${maxPageLimit}` })
