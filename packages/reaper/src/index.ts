/**
 * @engram/reaper: the reaper pass of SPEC §4.3 and the immediate reaction to a queued session,
 * as functions over any `Store`, with the policy as a parameter. The coordinator wraps them with
 * leadership, metrics and wake-ups; the fleet simulator runs them on the in-memory store.
 */
export * as Reaper from "./Reaper.js"
export * from "./ReaperEvents.js"
export * as ReaperState from "./ReaperState.js"
export * from "./Trigger.js"
