// A lock's holder as a log line shows it: its query without its literals (a query may hold a secret).
import { describe, expect, it } from "vitest"
import { maskQuery } from "../src/Blockers.js"

describe("a blocker's query in a log line", () => {
  it("has its string literals and dollar-quoted bodies masked, and is cut short", () => {
    expect(maskQuery("alter role app password 'hunter2'")).toBe("alter role app password '…'")
    expect(maskQuery("select E'it''s', $$secret$$, $t$x$t$ from t")).toBe("select '…', $…$, $…$ from t")
    expect(maskQuery("select 1\n   from t")).toBe("select 1 from t")
    expect(maskQuery(`select ${"x".repeat(500)}`)).toHaveLength(161)
  })
})
