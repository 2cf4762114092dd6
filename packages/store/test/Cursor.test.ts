import { describe, expect, it } from "vitest"
import { Cursor, InvalidInput } from "../src/index.js"

describe("Cursor", () => {
  it("a cursor names its list and the last key of a page, opaque", () => {
    const c = Cursor.encode("sessions", [12, "s-1"])
    expect(c).toMatch(/^[A-Za-z0-9_-]+$/)
    expect(Cursor.decode("sessions", c)).toEqual([12, "s-1"])
    expect(Cursor.decode("sessions", undefined)).toBeUndefined()
  })

  it("a cursor of another list, a mangled one or a made-up one is InvalidInput naming cursor", () => {
    const hosts = Cursor.encode("hosts", ["h1"])
    for (const bad of [hosts, "", "!!", "not-a-cursor", Buffer.from('["sessions","x","y"]').toString("base64url"), "A".repeat(3000)]) {
      const got = Cursor.decode("sessions", bad)
      expect(got, bad).toBeInstanceOf(InvalidInput)
      expect((got as InvalidInput).field).toBe("cursor")
    }
  })

  it("a well-formed cursor whose key no list holds is InvalidInput naming cursor: a fraction, a time past 2^53, a seq past 2^31, text with a NUL", () => {
    const made = (...parts: unknown[]) => Buffer.from(JSON.stringify(parts)).toString("base64url")
    const odd: [Cursor.List, string][] = [
      ["sessions", made("sessions", 1.5, "s")],
      ["sessions", made("sessions", 1e19, "s")],
      ["sessions", made("sessions", 1e308, "s")],
      ["sessions", made("sessions", 12, "s\u0000")],
      ["sessions", made("sessions", 12, "\ud800")],
      ["moves", made("moves", -1e19, "m")],
      ["queue", made("queue", 2 ** 53, "q")],
      ["hosts", made("hosts", "h\u0000")],
      ["reservations", made("reservations", 7)],
      ["events", made("events", 1.5)],
      ["events", made("events", 2 ** 31)],
      ["events", made("events", -1)],
    ]
    for (const [list, cursor] of odd) {
      const got = Cursor.decode(list, cursor)
      expect(got, `${list} ${Buffer.from(cursor, "base64url").toString()}`).toBeInstanceOf(InvalidInput)
      expect((got as InvalidInput).field).toBe("cursor")
    }
    // The edges a store can hold still decode.
    expect(Cursor.decode("sessions", made("sessions", Number.MAX_SAFE_INTEGER, "s"))).toEqual([Number.MAX_SAFE_INTEGER, "s"])
    expect(Cursor.decode("events", made("events", 2 ** 31 - 1))).toEqual([2 ** 31 - 1])
  })

  it("slice pages a sorted list: every item once, in order, and null after the last", () => {
    const items = Array.from({ length: 7 }, (_, i) => ({ id: `h${i}` }))
    const seen: string[] = []
    let cursor: string | undefined
    for (let pages = 0; pages < 10; pages++) {
      const after = Cursor.decode("hosts", cursor)
      if (Cursor.isInvalid(after)) throw after
      const page = Cursor.slice("hosts", items, (h) => [h.id] as const, after, 3)
      seen.push(...page.items.map((h) => h.id))
      if (page.nextCursor === null) break
      cursor = page.nextCursor
    }
    expect(seen).toEqual(items.map((h) => h.id))
    // An exact multiple of the limit: the last full page says there is no more.
    expect(Cursor.slice("hosts", items.slice(0, 6), (h) => [h.id] as const, undefined, 6).nextCursor).toBeNull()
  })

  it("a cursor keeps its place when items before it go away", () => {
    const items = ["a", "b", "c", "d"].map((id) => ({ id }))
    const first = Cursor.slice("hosts", items, (h) => [h.id] as const, undefined, 2)
    const after = Cursor.decode("hosts", first.nextCursor ?? undefined) as readonly [string]
    const rest = Cursor.slice("hosts", items.filter((h) => h.id !== "b"), (h) => [h.id] as const, after, 2)
    expect(rest.items.map((h) => h.id)).toEqual(["c", "d"])
  })
})
