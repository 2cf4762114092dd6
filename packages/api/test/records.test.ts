// The assignments' allowance entry on the wire: a pooled allowance travels as `learned` with its
// pool, which an agent of the previous release decodes (it knows only "prior" | "learned" and
// ignores keys it does not know), and the current agent turns back into the full source.
import { Records } from "@engram/api"
import { Schema } from "effect"
import { describe, expect, it } from "vitest"

/** The allowance entry as the previous release declared it (frozen here). */
const PreviousAllowance = Schema.Struct({
  sourceHostId: Schema.String,
  targetHostId: Schema.String,
  allowanceMs: Schema.Number,
  source: Schema.Literals(["prior", "learned"]),
  samples: Schema.Number,
})

describe("an assigned allowance", () => {
  it("every source round-trips through the wire form, which the previous release's schema decodes", () => {
    for (const source of ["prior", "learned", "target", "fleet"] as const) {
      const pair: Records.PairAllowance = { sourceHostId: "a", targetHostId: "b", allowanceMs: 80, source, samples: source === "prior" ? 0 : 5 }
      const wire = JSON.parse(JSON.stringify(Schema.encodeSync(Records.AssignedAllowance)(Records.assignedAllowance(pair)))) as unknown
      expect(Schema.decodeUnknownSync(PreviousAllowance)(wire).source).toBe(source === "prior" ? "prior" : "learned")
      expect(Records.pairAllowanceOf(Schema.decodeUnknownSync(Records.AssignedAllowance)(wire))).toEqual(pair)
    }
  })

  it("a pool that is not target or fleet is refused, naming the key", () => {
    expect(() => Schema.decodeUnknownSync(Records.AssignedAllowance)({ sourceHostId: "a", targetHostId: "b", allowanceMs: 1, source: "learned", samples: 1, pool: "galaxy" })).toThrow(/pool/)
  })
})
