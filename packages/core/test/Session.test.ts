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

describe("Session operations", () => {
  it("each operation starts only from its own states", () => {
    expect(Session.apply("markRunning", "pending", "running")._tag).toBe("Legal")
    // The life cycle allows parked → running, but that is unpark, not markRunning.
    expect(Session.apply("markRunning", "parked", "running")._tag).toBe("Illegal")
    expect(Session.apply("unpark", "parked", "running")._tag).toBe("Legal")
    // queued → pending is a drain, not a resume.
    expect(Session.apply("resume", "queued", "pending")._tag).toBe("Illegal")
    expect(Session.apply("resume", "descended", "queued")._tag).toBe("Legal")
    expect(Session.apply("idle", "parked", "descending")._tag).toBe("Illegal")
    expect(Session.apply("end", "ended", "ended")._tag).toBe("Illegal")
  })

  it("every operation's moves are legal in the life cycle", () => {
    for (const [op, rule] of Object.entries(Session.operations))
      for (const from of rule.from)
        for (const to of rule.to) expect(Session.apply(op as Session.Operation, from, to)._tag, `${op}: ${from} → ${to}`).toBe("Legal")
  })

  it("the illegal message names the operation and both states", () => {
    const t = Session.apply("markRunning", "moving", "running")
    expect(t._tag === "Illegal" && t.message).toBe("markRunning needs a session in pending, not moving (cannot go from moving to running)")
  })
})
