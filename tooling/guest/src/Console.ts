/**
 * What the real-QEMU tests of every package share: whether QEMU is here (and so whether those
 * tests run), and a guest's console read back: its counter lines and its boot banners.
 */
import { spawnSync } from "node:child_process"
import { readFileSync } from "node:fs"
import { ticks, type Tick } from "./Init.js"

/** Whether `qemu-system-x86_64` runs here. CI installs it (`tooling/scripts/system-deps.sh`), so there it must. */
export const haveQemu = spawnSync("qemu-system-x86_64", ["--version"], { stdio: "ignore" }).status === 0
/** Run the real-QEMU tests: QEMU is installed, or this is CI (where a missing QEMU must fail, not skip). */
export const runQemuTests = haveQemu || process.env["CI"] === "true"

/** The counter lines of a console file so far (none while the file is not there yet). */
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
