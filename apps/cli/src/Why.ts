/**
 * Why a session waits, summed the way Kubernetes says it ("0/3 nodes are available: 3
 * Insufficient memory"): how many hosts have room, and how many refuse it for each reason,
 * most common first. Pure.
 */
import type { Records } from "@engram/client"

/** The reasons in the order a tie is shown. */
const order = ["fits_now", "ram_full", "cpu_full", "entries_full", "unmeasured", "cordoned", "draining"]

/** `"0/40 hosts have room: 31 ram_full, 6 entries_full, 3 cordoned"`. */
export const summarize = (noFit: readonly Records.NoFitDetail[]): string => {
  const counts = new Map<string, number>()
  for (const d of noFit) counts.set(d.reason, (counts.get(d.reason) ?? 0) + 1)
  const room = counts.get("fits_now") ?? 0
  counts.delete("fits_now")
  const parts = [...counts.entries()]
    .sort((a, b) => b[1] - a[1] || order.indexOf(a[0]) - order.indexOf(b[0]) || a[0].localeCompare(b[0]))
    .map(([reason, n]) => `${n} ${reason}`)
  const total = noFit.length
  const head = `${room}/${total} host${total === 1 ? "" : "s"} ${room === 1 && total === 1 ? "has" : "have"} room`
  return parts.length === 0 ? head : `${head}: ${parts.join(", ")}`
}

/** What each reason means, for the lines under the summary. */
export const meaning: Readonly<Record<string, string>> = {
  ram_full: "not enough free RAM",
  cpu_full: "not enough free vCPUs",
  entries_full: "at its limit of reservations (maxEntriesPerNode)",
  unmeasured: "has not reported its size yet",
  cordoned: "cordoned: takes nothing new",
  draining: "draining: takes nothing new",
  fits_now: "has room now (the queue drains on the next change or reaper pass)",
}
