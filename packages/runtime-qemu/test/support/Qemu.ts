// What the real-QEMU tests share: whether QEMU is here, the guest, and polling a guest's
// console (bounded retries on Effect's Clock: a poll, never a sleep standing in for a wait).
import { spawnSync } from "node:child_process"
import { readFileSync } from "node:fs"
import { ticks, type Tick } from "@engram/guest"
import { Effect, Schedule } from "effect"

/** Whether `qemu-system-x86_64` runs here. CI installs it (`.ci/run`), so there it must. */
export const haveQemu = spawnSync("qemu-system-x86_64", ["--version"], { stdio: "ignore" }).status === 0
/** Run the real-QEMU tests: QEMU is installed, or this is CI (where a missing QEMU must fail, not skip). */
export const runQemuTests = haveQemu || process.env["CI"] === "true"

/** The counter lines of a console file so far. */
export const consoleTicks = (path: string): Tick[] => {
  try {
    return ticks(readFileSync(path, "utf8"))
  } catch {
    return []
  }
}

/** How many times the guest printed its boot banner into a console file. */
export const boots = (path: string): number => {
  try {
    return readFileSync(path, "utf8").split("\n").filter((l) => l.startsWith("engram-guest boot=")).length
  } catch {
    return 0
  }
}

/** Polls `path` until its last counter line satisfies `ok` (every 100 ms, at most 3 min). */
export const awaitTick = (path: string, ok: (t: Tick) => boolean, what: string): Effect.Effect<Tick, Error> =>
  Effect.suspend(() => {
    const last = consoleTicks(path).at(-1)
    return last !== undefined && ok(last) ? Effect.succeed(last) : Effect.fail(new Error(`${what}: last counter line ${JSON.stringify(last ?? null)} in ${path}`))
  }).pipe(Effect.retry({ schedule: Schedule.spaced("100 millis"), times: 1800 }))

/** The guest continued: the same boot, a higher counter. */
export const continuedFrom = (before: Tick) => (t: Tick) => t.bootId === before.bootId && t.n > before.n
