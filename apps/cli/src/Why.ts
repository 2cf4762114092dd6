/**
 * Why a session waits, summed the way Kubernetes says it ("0/3 nodes are available: 3
 * Insufficient memory"): how many hosts have room, and how many refuse it for each reason,
 * most common first. Pure.
 */
import type { Records } from "@engram/client"

/** The reasons in the order a tie is shown. */
const order = ["fits_now", "ram_full", "cpu_full", "entries_full", "unmeasured", "silent", "cordoned", "draining"]

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
  silent: "its agent has not reported for longer than the stale window: takes nothing until it reports again",
  cordoned: "cordoned: takes nothing new",
  draining: "draining: takes nothing new",
  fits_now: "has room now (the queue drains on the next change or reaper pass)",
}

/**
 * Whether the park gate's parks may make room for a queued session (SPEC §4.1): while a session
 * waits without room anywhere, the gate makes parks yield (descend, releasing their room), the
 * oldest on each host with a park and no descent running, one per host per pass. From the
 * hosts' reasons and the parked sessions (their hosts and budgets): the hosts refusing for room
 * (`ram_full`, `cpu_full`) whose free room plus their parks' budgets would hold the session. Null
 * when there are no parks on such hosts, or a host has room now (the queue drains without them).
 */
export const parksHint = (
  budget: Records.Budget,
  noFit: readonly Records.NoFitDetail[],
  parked: readonly Pick<Records.Session, "hostId" | "budget">[],
): string | null => {
  if (noFit.some((d) => d.reason === "fits_now")) return null
  const onHost = new Map<string, { count: number; memMib: number; vcpus: number }>()
  for (const p of parked) {
    if (p.hostId === null) continue
    const sum = onHost.get(p.hostId) ?? { count: 0, memMib: 0, vcpus: 0 }
    onHost.set(p.hostId, { count: sum.count + 1, memMib: sum.memMib + p.budget.memMib, vcpus: sum.vcpus + p.budget.vcpus })
  }
  const full = noFit.filter((d) => (d.reason === "ram_full" || d.reason === "cpu_full") && onHost.has(d.hostId))
  if (full.length === 0) return null
  const count = full.reduce((n, d) => n + (onHost.get(d.hostId)?.count ?? 0), 0)
  const enough = full
    .filter((d) => {
      const p = onHost.get(d.hostId)!
      return (d.freeMib ?? 0) + p.memMib >= budget.memMib && (d.freeVcpus ?? 0) + p.vcpus >= budget.vcpus
    })
    .map((d) => d.hostId)
    .sort()
  // Which parks, and how many, the configured policy descends is the reaper's choice: say only where parks could make the room.
  const parks = `${count} parked session${count === 1 ? "" : "s"} on ${full.length === 1 ? "a full host" : "full hosts"}`
  return enough.length > 0
    ? `Parks can make room: ${parks}; descending them would make room for it on ${enough.join(", ")} (the park gate makes parks yield while a session waits).`
    : `There ${count === 1 ? "is" : "are"} ${parks}, but ${count === 1 ? "its" : "their"} room would not hold it on any one host.`
}
