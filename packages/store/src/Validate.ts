/**
 * Input rules shared by every backend, so a bad id or budget is refused with the same field
 * and rule whichever store runs. Each check answers the first broken rule, or null.
 */
import type { Budget } from "@engram/core"
import { Ledger } from "@engram/core"
import { InvalidInput } from "./Errors.js"
import type { HostReport, MoveRound } from "./Types.js"

const ID = /^[A-Za-z0-9._:-]{1,128}$/

/** Ids of hosts, sessions and reservations: 1–128 of `[A-Za-z0-9._:-]`. */
export const id = (field: string, value: unknown): InvalidInput | null =>
  typeof value !== "string" || !ID.test(value) ? new InvalidInput({ field, rule: "must be 1-128 characters of [A-Za-z0-9._:-]" }) : null

// Every figure must fit the stores' 64-bit columns exactly: past 2^53 - 1 a number is not exact.
const MAX = Number.MAX_SAFE_INTEGER

const integerAtLeast = (field: string, value: unknown, min: number): InvalidInput | null =>
  typeof value !== "number" || !Number.isInteger(value) || value < min
    ? new InvalidInput({ field, rule: min === 1 ? "must be an integer > 0" : `must be an integer >= ${min}` })
    : value > MAX
      ? new InvalidInput({ field, rule: `must be <= ${MAX}` })
      : null

const finiteAtLeastZero = (field: string, value: unknown): InvalidInput | null =>
  typeof value !== "number" || !Number.isFinite(value) || value < 0
    ? new InvalidInput({ field, rule: "must be a finite number >= 0" })
    : value > MAX
      ? new InvalidInput({ field, rule: `must be <= ${MAX}` })
      : null

/** Free text (labels, descriptions, reasons): any string without a NUL character, which PostgreSQL text cannot hold. */
export const text = (field: string, value: unknown): InvalidInput | null =>
  typeof value !== "string" ? new InvalidInput({ field, rule: "must be a string" }) : value.includes("\u0000") ? new InvalidInput({ field, rule: "must not contain a NUL character" }) : null

/** A session budget: `memMib` an integer > 0, `vcpus` an integer > 0. */
export const budget = (b: Budget): InvalidInput | null => integerAtLeast("memMib", b.memMib, 1) ?? integerAtLeast("vcpus", b.vcpus, 1)

/** A new session: its id, budget and affinity list. */
export const sessionInput = (input: { id: unknown; budget: Budget; affinity?: unknown }): InvalidInput | null =>
  id("id", input.id) ??
  budget(input.budget) ??
  (input.affinity === undefined || (Array.isArray(input.affinity) && input.affinity.every((a) => typeof a === "string"))
    ? null
    : new InvalidInput({ field: "affinity", rule: "must be an array of host ids" }))

/** A new host: its id and labels. */
export const hostInput = (input: { id: unknown; labels?: unknown }): InvalidInput | null =>
  id("id", input.id) ??
  (input.labels === undefined ||
  (typeof input.labels === "object" &&
    input.labels !== null &&
    !Array.isArray(input.labels) &&
    Object.entries(input.labels).every(([k, v]) => text("labels", k) === null && text("labels", v) === null))
    ? null
    : new InvalidInput({ field: "labels", rule: "must be an object of string values" }))

/** A host report: each figure null or a finite number >= 0; `totalVcpus` an integer. */
export const report = (r: HostReport): InvalidInput | null => {
  for (const field of ["totalMib", "allocatableMib"] as const) {
    const v = r[field]
    if (v !== null) {
      const bad = finiteAtLeastZero(field, v)
      if (bad) return bad
    }
  }
  return r.totalVcpus === null ? null : integerAtLeast("totalVcpus", r.totalVcpus, 0)
}

/** A move's budget: `maxDowntimeMs` finite and > 0. */
export const maxDowntimeMs = (v: unknown): InvalidInput | null =>
  typeof v !== "number" || !Number.isFinite(v) || v <= 0 ? new InvalidInput({ field: "maxDowntimeMs", rule: "must be a finite number > 0" }) : null

/** The estimate an abort records: absent, or a finite number >= 0. */
export const estimateMs = (v: unknown): InvalidInput | null => (v === undefined ? null : finiteAtLeastZero("estimateMs", v))

/** A pre-copy round: a known kind and every figure finite and >= 0. */
export const round = (r: MoveRound): InvalidInput | null => {
  if (r.kind !== "full" && r.kind !== "delta" && r.kind !== "final")
    return new InvalidInput({ field: "kind", rule: "must be one of full, delta, final" })
  for (const field of ["wireBytes", "apparentBytes", "sendMs", "captureMs"] as const) {
    const bad = finiteAtLeastZero(field, r[field])
    if (bad) return bad
  }
  return null
}

/** The owner kind of a reservation. */
export const ownerKind = (v: unknown): InvalidInput | null =>
  typeof v === "string" && (Ledger.ownerKinds as readonly string[]).includes(v)
    ? null
    : new InvalidInput({ field: "ownerKind", rule: `must be one of ${Ledger.ownerKinds.join(", ")}` })

/**
 * The shape of a reservation request, before the ledger's checks: a given id follows the id
 * rule (a missing one is the ledger's `id_missing`), figures fit exactly, `vramMib` >= 0,
 * `expiresAt` finite, `ownerId` and `description` text.
 */
export const reserveExtras = (r: {
  id?: unknown
  memMib?: unknown
  vcpus?: unknown
  vramMib?: unknown
  expiresAt?: unknown
  description?: unknown
  ownerId?: unknown
}): InvalidInput | null =>
  (r.id == null || r.id === "" ? null : id("id", r.id)) ??
  (typeof r.memMib === "number" && Math.abs(r.memMib) > MAX ? new InvalidInput({ field: "memMib", rule: `must be <= ${MAX}` }) : null) ??
  (typeof r.vcpus === "number" && Math.abs(r.vcpus) > MAX ? new InvalidInput({ field: "vcpus", rule: `must be <= ${MAX}` }) : null) ??
  (typeof r.ownerId === "string" && r.ownerId.length > 0 && text("ownerId", r.ownerId) === null
    ? null
    : new InvalidInput({ field: "ownerId", rule: "must be a non-empty string without NUL" })) ??
  (r.vramMib == null ? null : finiteAtLeastZero("vramMib", r.vramMib)) ??
  (r.expiresAt == null || (typeof r.expiresAt === "number" && Number.isFinite(r.expiresAt))
    ? null
    : new InvalidInput({ field: "expiresAt", rule: "must be epoch milliseconds" })) ??
  (r.description == null ? null : text("description", r.description))

/**
 * A committed move's phases (SPEC §5): each a finite figure >= 0, and capture + send + commit
 * within the downtime they are parts of.
 */
export const phases = (p: { downtimeMs: number; captureMs: number; sendMs: number; commitMs: number }): InvalidInput | null => {
  for (const field of ["downtimeMs", "captureMs", "sendMs", "commitMs"] as const) {
    const bad = finiteAtLeastZero(field, p[field])
    if (bad) return bad
  }
  // The phases are parts of the pause. (Each is > 0 in a real move, but a clock with ms
  // resolution may time a short send as 0, so only the sum is held to SPEC §5 here.)
  return p.captureMs + p.sendMs + p.commitMs <= p.downtimeMs
    ? null
    : new InvalidInput({ field: "downtimeMs", rule: "must be >= captureMs + sendMs + commitMs" })
}
