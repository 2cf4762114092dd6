// A lock's holder as a log line shows it: its query without its literals (a query may hold a secret).
import { describe, expect, it } from "vitest"
import { maskQuery } from "../src/Blockers.js"

describe("a blocker's query in a log line", () => {
  it("has its string literals and dollar-quoted bodies masked, and is cut short", () => {
    expect(maskQuery("alter role app password 'hunter2'")).toBe("alter role app password '…'")
    expect(maskQuery("select E'it''s', $$secret$$, $t$x$t$ from t")).toBe("select '…', $…$, $…$ from t")
    expect(maskQuery("select 1\n   from t")).toBe("select 1 from t")
    // A backslash-escaped quote inside an E'' string does not end it (the secret after it stays masked).
    expect(maskQuery("alter role app password E'pa\\'ss hunter2'")).toBe("alter role app password '…'")
    expect(maskQuery("select U&'d\\0061t', B'101', X'ff' from t")).toBe("select '…', '…', '…' from t")
    // Not an E'' string: a word ending in e before a plain string (like'…') keeps its backslash literal.
    expect(maskQuery("select 1 where p like'C:\\' and password='hunter2'")).toBe("select 1 where p like'…' and password='…'")
    expect(maskQuery(`select ${"x".repeat(500)}`)).toHaveLength(161)
  })
})
