import { describe, expect, it } from "vitest"
import { Session } from "../src/index.js"

const legal: [Session.State, Session.State][] = [
  ["queued", "pending"],
  ["pending", "running"],
  ["running", "parked"],
  ["running", "descending"],
  ["parked", "running"],
  ["parked", "descending"],
  ["descending", "descended"],
  ["descended", "queued"],
  ["descended", "pending"],
  ["running", "moving"],
  ["moving", "running"],
  ["pending", "lost"],
  ["running", "lost"],
  ["parked", "lost"],
  ["descending", "lost"],
  ["moving", "lost"],
  ["lost", "ended"],
]

describe("Session transitions", () => {
  it.each(legal)("%s → %s is legal", (from, to) => {
    expect(Session.transition(from, to)._tag).toBe("Legal")
  })

  it("any state but ended may end", () => {
    for (const s of Session.states) expect(Session.canTransition(s, "ended")).toBe(s !== "ended")
  })

  it("every other pair is illegal, with a message naming both states", () => {
    const allowed = new Set([...legal.map(([a, b]) => `${a}>${b}`), ...Session.states.filter((s) => s !== "ended").map((s) => `${s}>ended`)])
    let illegal = 0
    for (const from of Session.states)
      for (const to of Session.states) {
        if (allowed.has(`${from}>${to}`)) continue
        const t = Session.transition(from, to)
        expect(t._tag).toBe("Illegal")
        if (t._tag === "Illegal") expect(t.message).toContain(`from ${from} to ${to}`)
        illegal++
      }
    expect(illegal).toBe(81 - allowed.size)
  })

  it("a session holds a reservation exactly from pending until it descends, ends or is lost", () => {
    expect(Session.states.filter(Session.holdsReservation)).toEqual(["pending", "running", "parked", "descending", "moving"])
  })
})
