import { describe, expect, it } from "vitest"
import { InvalidInput, Validate } from "../src/index.js"

const rule = (e: InvalidInput | null) => (e === null ? null : [e.field, e.rule])

describe("Validate", () => {
  it("one id rule: 1-100 characters of [A-Za-z0-9._-], not . or .. (SPEC §12)", () => {
    expect(Validate.id("id", "host-1.a_b")).toBeNull()
    expect(Validate.id("id", "x".repeat(100))).toBeNull()
    expect(Validate.id("id", "...")).toBeNull()
    expect(rule(Validate.id("id", ""))).toEqual(["id", "must be 1-100 characters of [A-Za-z0-9._-], and not . or .."])
    for (const bad of ["a/b", "a:b", "x".repeat(101), ".", "..", "a b", "é", 7, null])
      expect(rule(Validate.id("hostId", bad)), String(bad)).toEqual(["hostId", Validate.idRule])
  })

  it("text refuses NUL and lone surrogates, and keeps paired ones", () => {
    expect(Validate.text("reason", "ok 😀")).toBeNull()
    expect(rule(Validate.text("reason", "a\u0000b"))).toEqual(["reason", "must not contain a NUL character"])
    for (const lone of ["\ud800", "a\udc00", "\ud800x", "x\udfff\ud800"])
      expect(rule(Validate.text("labels", lone))).toEqual(["labels", "must not contain a lone surrogate (text must be valid Unicode)"])
  })

  it("affinity entries and a reservation's hostId are host ids; labels are text", () => {
    const s = { id: "s", budget: { memMib: 1, vcpus: 1 } }
    expect(rule(Validate.sessionInput({ ...s, affinity: ["a", "b\u0000"] }))).toEqual(["affinity.1", Validate.idRule])
    expect(rule(Validate.sessionInput({ ...s, affinity: ["\ud800"] }))?.[0]).toBe("affinity.0")
    expect(rule(Validate.sessionInput({ ...s, onNoRoom: "wait" }))).toEqual(["onNoRoom", "must be one of queue, refuse"])
    expect(rule(Validate.hostInput({ id: "h", labels: { "\ud800": "a" } }))?.[0]).toBe("labels")
    expect(rule(Validate.hostInput({ id: "h", labels: { a: "\u0000" } }))?.[0]).toBe("labels")
    expect(rule(Validate.reserveExtras({ hostId: "h\u0000", ownerId: "o" }, 0))).toEqual(["hostId", Validate.idRule])
  })

  it("figures are finite and exact: at most 2^53 - 1", () => {
    expect(rule(Validate.maxDowntimeMs(1e21))).toEqual(["maxDowntimeMs", `must be <= ${Number.MAX_SAFE_INTEGER}`])
    expect(rule(Validate.estimateMs(1e21))).toEqual(["estimateMs", `must be <= ${Number.MAX_SAFE_INTEGER}`])
    expect(rule(Validate.reserveExtras({ ownerId: "o", expiresAt: 1e21 }, 0))?.[0]).toBe("expiresAt")
  })

  it("a commit's phases are each > 0 and sum to at most the downtime", () => {
    expect(Validate.phases({ downtimeMs: 500, captureMs: 40, sendMs: 80, commitMs: 300 })).toBeNull()
    expect(rule(Validate.phases({ downtimeMs: 500, captureMs: 0, sendMs: 80, commitMs: 300 }))).toEqual(["captureMs", "must be a finite number > 0"])
    expect(rule(Validate.phases({ downtimeMs: 100, captureMs: 40, sendMs: 80, commitMs: 300 }))).toEqual(["downtimeMs", "must be >= captureMs + sendMs + commitMs"])
  })

  it("a page limit is an integer from 1 to 1000", () => {
    expect(Validate.pageLimit(undefined)).toBeNull()
    expect(Validate.pageLimit(1000)).toBeNull()
    for (const bad of [0, 1001, 1.5, Number.NaN]) expect(rule(Validate.pageLimit(bad))?.[0]).toBe("limit")
  })

  it("a session budget needs integer memMib and vcpus above zero, memMib named first", () => {
    expect(Validate.budget({ memMib: 1024, vcpus: 1 })).toBeNull()
    expect(rule(Validate.budget({ memMib: 0, vcpus: 0 }))).toEqual(["memMib", "must be an integer > 0"])
    expect(rule(Validate.budget({ memMib: 1.5, vcpus: 1 }))).toEqual(["memMib", "must be an integer > 0"])
    expect(rule(Validate.budget({ memMib: 1, vcpus: 0 }))).toEqual(["vcpus", "must be an integer > 0"])
  })

  it("a session's affinity is a list of at most 64 host ids, each once", () => {
    expect(Validate.sessionInput({ id: "s", budget: { memMib: 1, vcpus: 1 }, affinity: ["a"] })).toBeNull()
    expect(rule(Validate.sessionInput({ id: "s", budget: { memMib: 1, vcpus: 1 }, affinity: "a" }))).toEqual(["affinity", "must be an array of at most 64 host ids"])
    const hosts = Array.from({ length: 65 }, (_, i) => `h${i}`)
    expect(Validate.affinity(hosts.slice(1))).toBeNull()
    expect(rule(Validate.affinity(hosts))).toEqual(["affinity", "must be an array of at most 64 host ids"])
    expect(rule(Validate.affinity(["a", "b", "c", "b"]))).toEqual(["affinity.3", "must name a host once (it repeats affinity.1)"])
  })

  it("host labels are string values", () => {
    expect(Validate.hostInput({ id: "h", labels: { zone: "a" } })).toBeNull()
    expect(rule(Validate.hostInput({ id: "h", labels: { zone: 1 } }))).toEqual(["labels", "must be an object of string values"])
  })

  it("a report's figures are null or non-negative, cores an integer", () => {
    expect(Validate.report({ totalMib: null, allocatableMib: null, totalVcpus: null })).toBeNull()
    expect(rule(Validate.report({ totalMib: -1, allocatableMib: 1, totalVcpus: 1 }))).toEqual(["totalMib", "must be a finite number >= 0"])
    expect(rule(Validate.report({ totalMib: 1, allocatableMib: Number.NaN, totalVcpus: 1 }))).toEqual(["allocatableMib", "must be a finite number >= 0"])
    expect(rule(Validate.report({ totalMib: 1, allocatableMib: 1, totalVcpus: 1.5 }))).toEqual(["totalVcpus", "must be an integer >= 0"])
  })

  it("a host offers no more RAM than it has: allocatableMib above totalMib names allocatableMib and the rule", () => {
    expect(rule(Validate.report({ totalMib: 1024, allocatableMib: 500_000, totalVcpus: 4 }))).toEqual(["allocatableMib", "must be <= totalMib (1024)"])
    expect(Validate.report({ totalMib: 1024, allocatableMib: 1024, totalVcpus: 4 })).toBeNull()
    // Only one figure measured: nothing to compare.
    expect(Validate.report({ totalMib: null, allocatableMib: 500_000, totalVcpus: 4 })).toBeNull()
    expect(Validate.report({ totalMib: 1024, allocatableMib: null, totalVcpus: 4 })).toBeNull()
  })

  it("a reservation's expiry may not have passed already: -1 or any time before now names expiresAt", () => {
    const now = 1_700_000_000_000
    for (const expiresAt of [-1, 0, now - 1]) {
      expect(rule(Validate.reserveExtras({ ownerId: "o", expiresAt }, now)), String(expiresAt)).toEqual(["expiresAt", `must not be in the past (now is ${now} epoch ms)`])
    }
    for (const expiresAt of [now, now + 1, null, undefined]) expect(Validate.reserveExtras({ ownerId: "o", expiresAt }, now), String(expiresAt)).toBeNull()
  })

  it("moves need a positive budget and well-formed rounds", () => {
    expect(rule(Validate.maxDowntimeMs(0))).toEqual(["maxDowntimeMs", "must be a finite number > 0"])
    expect(Validate.maxDowntimeMs(600)).toBeNull()
    expect(rule(Validate.round({ kind: "delta", wireBytes: -1, apparentBytes: 0, sendMs: 0, captureMs: 0 }))).toEqual(["wireBytes", "must be a finite number >= 0"])
    expect(rule(Validate.round({ kind: "other" as "delta", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 }))).toEqual(["kind", "must be one of full, delta, intent, final"])
    // The intent carries no figures: each one is refused by name.
    expect(rule(Validate.round({ kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 3, captureMs: 0 }))).toEqual(["sendMs", "must be 0 for an intent (it carries no figures)"])
    expect(Validate.round({ kind: "intent", wireBytes: 0, apparentBytes: 0, sendMs: 0, captureMs: 0 })).toBeNull()
  })

  it("reservations name a known owner kind and a non-empty owner", () => {
    expect(Validate.ownerKind("external")).toBeNull()
    expect(rule(Validate.ownerKind("vm"))).toEqual(["ownerKind", "must be one of session, move, capture, external"])
    expect(rule(Validate.reserveExtras({ ownerId: "" }, 0))).toEqual(["ownerId", "must be a non-empty string without NUL"])
    expect(rule(Validate.reserveExtras({ ownerId: "x", vramMib: -2 }, 0))).toEqual(["vramMib", "must be a finite number >= 0"])
    expect(rule(Validate.reserveExtras({ ownerId: "x", expiresAt: "soon" }, 0))).toEqual(["expiresAt", `must be epoch milliseconds (a finite number, at most ${Number.MAX_SAFE_INTEGER})`])
  })

  it("errors carry a message naming the field and the rule", () => {
    expect(new InvalidInput({ field: "memMib", rule: "must be an integer > 0" }).message).toBe("memMib must be an integer > 0")
  })
})

describe("Validate: what the stores' columns can hold", () => {
  it("integers past 2^53 - 1 are refused by name, not left to overflow a column", () => {
    expect(rule(Validate.budget({ memMib: 1e19, vcpus: 1 }))).toEqual(["memMib", `must be <= ${Number.MAX_SAFE_INTEGER}`])
    expect(rule(Validate.report({ totalMib: 1, allocatableMib: 1, totalVcpus: 1e19 }))).toEqual(["totalVcpus", `must be <= ${Number.MAX_SAFE_INTEGER}`])
    expect(rule(Validate.reserveExtras({ ownerId: "x", memMib: 1e19 }, 0))).toEqual(["memMib", `must be <= ${Number.MAX_SAFE_INTEGER}`])
  })

  it("text with a NUL character is refused: PostgreSQL text cannot hold it", () => {
    expect(rule(Validate.text("reason", "a\u0000b"))).toEqual(["reason", "must not contain a NUL character"])
    expect(Validate.text("reason", "timeout")).toBeNull()
    expect(rule(Validate.reserveExtras({ ownerId: "x", description: "a\u0000b" }, 0))).toEqual(["description", "must not contain a NUL character"])
    expect(rule(Validate.reserveExtras({ ownerId: "a\u0000b" }, 0))).toEqual(["ownerId", "must be a non-empty string without NUL"])
    expect(rule(Validate.hostInput({ id: "h", labels: { zone: "a\u0000" } }))).toEqual(["labels", "must not contain a NUL character"])
  })

  it("a given reservation id and hostId follow the id rule, the empty string included; a missing one is left to the ledger's id_missing or host_missing", () => {
    for (const id of ["a\u0000b", "", " ", "a:b", "x".repeat(101)]) expect(rule(Validate.reserveExtras({ id, ownerId: "x" }, 0)), JSON.stringify(id)).toEqual(["id", Validate.idRule])
    for (const hostId of ["", "h1:x", "h 1", ".."]) expect(rule(Validate.reserveExtras({ id: "r1", hostId, ownerId: "x" }, 0)), JSON.stringify(hostId)).toEqual(["hostId", Validate.idRule])
    expect(Validate.reserveExtras({ id: null, hostId: null, ownerId: "x" }, 0)).toBeNull()
    expect(Validate.reserveExtras({ ownerId: "x" }, 0)).toBeNull()
    expect(Validate.reserveExtras({ id: "r1", hostId: "h-1.a_b", ownerId: "x" }, 0)).toBeNull()
  })

  it("a move's phases are figures > 0 whose capture, send and commit fit within the downtime", () => {
    expect(Validate.phases({ downtimeMs: 546, captureMs: 40, sendMs: 86, commitMs: 420 })).toBeNull()
    expect(Validate.phases({ downtimeMs: 5, captureMs: 2, sendMs: 0.4, commitMs: 2 })).toBeNull()
    expect(rule(Validate.phases({ downtimeMs: 5, captureMs: 2, sendMs: 0, commitMs: 3 }))).toEqual(["sendMs", "must be a finite number > 0"])
    expect(rule(Validate.phases({ downtimeMs: -5, captureMs: 0, sendMs: 0, commitMs: 0 }))).toEqual(["downtimeMs", "must be a finite number > 0"])
    expect(rule(Validate.phases({ downtimeMs: 100, captureMs: 40, sendMs: 80, commitMs: 420 }))).toEqual(["downtimeMs", "must be >= captureMs + sendMs + commitMs"])
  })
})
