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

const integerAtLeast = (field: string, value: unknown, min: number): InvalidInput | null =>
  typeof value !== "number" || !Number.isInteger(value) || value < min
    ? new InvalidInput({ field, rule: min === 1 ? "must be an integer > 0" : `must be an integer >= ${min}` })
    : null

const finiteAtLeastZero = (field: string, value: unknown): InvalidInput | null =>
  typeof value !== "number" || !Number.isFinite(value) || value < 0 ? new InvalidInput({ field, rule: "must be a finite number >= 0" }) : null

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
  (typeof input.labels === "object" && input.labels !== null && !Array.isArray(input.labels) && Object.values(input.labels).every((v) => typeof v === "string"))
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

/** Optional reservation fields: `vramMib` >= 0, `expiresAt` finite, `description` a string. */
export const reserveExtras = (r: { vramMib?: unknown; expiresAt?: unknown; description?: unknown; ownerId?: unknown }): InvalidInput | null =>
  (typeof r.ownerId === "string" && r.ownerId.length > 0 ? null : new InvalidInput({ field: "ownerId", rule: "must be a non-empty string" })) ??
  (r.vramMib == null ? null : finiteAtLeastZero("vramMib", r.vramMib)) ??
  (r.expiresAt == null || (typeof r.expiresAt === "number" && Number.isFinite(r.expiresAt))
    ? null
    : new InvalidInput({ field: "expiresAt", rule: "must be epoch milliseconds" })) ??
  (r.description == null || typeof r.description === "string" ? null : new InvalidInput({ field: "description", rule: "must be a string" }))
