// The bound of an agent's heartbeat or report: the agent's stated bound less the time to say why,
// only when that is shorter than the store's own; a header that is not a positive integer is none.
import { describe, expect, it } from "vitest"
import { agentCallMsOf, answerMarginMs, routeBoundMs } from "../src/AgentBound.js"

describe("an agent's stated bound", () => {
  it("bounds the route below it by the margin, only when shorter than the store's bound and long enough to do anything", () => {
    expect(answerMarginMs).toBe(2500)
    expect(routeBoundMs(10_000, 15_000)).toBe(7500)
    // One URL: the agent waits 30 s, longer than the store's bound: the store's alone.
    expect(routeBoundMs(30_000, 15_000)).toBeNull()
    expect(routeBoundMs(17_500, 15_000)).toBeNull()
    // Too short to leave the work anything: the store's bound alone (the agent moves, as before).
    expect(routeBoundMs(2_900, 15_000)).toBeNull()
    expect(routeBoundMs(3_000, 15_000)).toBe(500)
  })

  it("is read from its header as a positive integer of ms, else ignored", () => {
    expect(agentCallMsOf({ "engram-agent-call-timeout-ms": "10000" })).toBe(10_000)
    expect(agentCallMsOf({ "engram-agent-call-timeout-ms": " 4000 " })).toBe(4000)
    for (const bad of ["", "0", "-5", "1e4", "ten", "99999999999"]) expect(agentCallMsOf({ "engram-agent-call-timeout-ms": bad })).toBeNull()
    expect(agentCallMsOf({})).toBeNull()
  })
})
