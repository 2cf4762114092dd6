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
