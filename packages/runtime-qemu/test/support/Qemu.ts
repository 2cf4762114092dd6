// What the real-QEMU tests share: whether QEMU is here, the guest, and polling a guest's
// console (bounded retries on Effect's Clock: a poll, never a sleep standing in for a wait).
import { consoleTicks, type Tick } from "@engram/guest"

export { boots, consoleTicks, haveQemu, runQemuTests } from "@engram/guest"
import { Effect, Schedule } from "effect"

/** Polls `path` until its last counter line satisfies `ok` (every 100 ms, at most 3 min). */
export const awaitTick = (path: string, ok: (t: Tick) => boolean, what: string): Effect.Effect<Tick, Error> =>
  Effect.suspend(() => {
    const last = consoleTicks(path).at(-1)
    return last !== undefined && ok(last) ? Effect.succeed(last) : Effect.fail(new Error(`${what}: last counter line ${JSON.stringify(last ?? null)} in ${path}`))
  }).pipe(Effect.retry({ schedule: Schedule.spaced("100 millis"), times: 1800 }))

/** The guest continued: the same boot, a higher counter. */
export const continuedFrom = (before: Tick) => (t: Tick) => t.bootId === before.bootId && t.n > before.n
