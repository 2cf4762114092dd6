// @ts-check
// How the dashboard shows figures: RAM in MiB/GiB/TiB, vCPUs, durations and ages, and the
// queue's reasons summed. Pure functions (the CLI's Format and Why say the same things).

/** @param {number | null | undefined} n */
export const mib = (n) => {
  if (n === null || n === undefined || !Number.isFinite(n)) return "-"
  const trim = (/** @type {number} */ x) => (Number.isInteger(x) ? String(x) : x.toFixed(1).replace(/\.0$/, ""))
  const a = Math.abs(n)
  if (a >= 1024 * 1024) return `${trim(n / (1024 * 1024))} TiB`
  if (a >= 1024) return `${trim(n / 1024)} GiB`
  return `${trim(n)} MiB`
}

/** `1 park`, `2 parks`. @param {number} n @param {string} noun */
export const count = (n, noun) => `${n} ${noun}${n === 1 ? "" : "s"}`

/** @param {number} n */
export const vcpus = (n) => `${n} vCPU${n === 1 ? "" : "s"}`

/** @param {{ memMib: number, vcpus: number }} b */
export const budget = (b) => `${mib(b.memMib)}, ${vcpus(b.vcpus)}`

/** @param {number} ms */
export const duration = (ms) => {
  if (!Number.isFinite(ms) || ms < 0) return "-"
  if (ms < 1000) return `${Math.round(ms)} ms`
  const s = Math.floor(ms / 1000)
  if (s < 60) return `${s}s`
  const m = Math.floor(s / 60)
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`
  const hr = Math.floor(m / 60)
  if (hr < 48) return `${hr}h ${String(m % 60).padStart(2, "0")}m`
  return `${Math.floor(hr / 24)}d ${hr % 24}h`
}

/** A measured time with its precision: `38 ms`, `2.4 s`. @param {number} ms */
export const measured = (ms) => (!Number.isFinite(ms) || ms < 0 ? "-" : ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(1)} s`)

/** @param {number | null | undefined} at */
export const age = (at) => (at === null || at === undefined ? "-" : duration(Date.now() - at))

/** A moment as the local time of day, with the date when it is not today. @param {number} at */
export const clock = (at) => {
  const d = new Date(at)
  const time = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false })
  return d.toDateString() === new Date().toDateString() ? time : `${d.toLocaleDateString()} ${time}`
}

/** @param {number} bytes */
export const bytes = (bytes) => mib(bytes / (1024 * 1024))

/** `0/2 hosts have room: 1 ram_full, 1 cordoned`. @param {{ reason: string }[]} noFit */
export const summarize = (noFit) => {
  /** @type {Map<string, number>} */
  const counts = new Map()
  for (const d of noFit) counts.set(d.reason, (counts.get(d.reason) ?? 0) + 1)
  const room = counts.get("fits_now") ?? 0
  counts.delete("fits_now")
  const parts = [...counts.entries()].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0])).map(([r, n]) => `${n} ${r}`)
  const head = `${room}/${noFit.length} host${noFit.length === 1 ? "" : "s"} ${room === 1 && noFit.length === 1 ? "has" : "have"} room`
  return parts.length === 0 ? head : `${head}: ${parts.join(", ")}`
}

/** Since when a session is in its state: parked or queued time, else its last change. @param {any} s */
export const since = (s) => (s.state === "parked" ? s.parkedAt : s.state === "queued" ? s.queuedAt : s.updatedAt)

/** How far an estimate was off, signed: `+25 ms` (pessimistic), `-12 ms` (short). @param {number} ms */
export const signed = (ms) => `${ms >= 0 ? "+" : "-"}${Math.round(Math.abs(ms))} ms`

/**
 * Who committed a move, for a person (the CLI's "committed by" says the same): its source (its
 * commit with its phases), its target's resolution (it runs the guest) or an operator's; null
 * while not committed, or committed before the field, and absent from an older coordinator.
 */
const committedByText = /** @type {Record<string, string>} */ ({
  source: "its source (phases measured)",
  target: "its target's resolution (it runs the guest)",
  operator: "an operator (engram moves commit)",
})

/** Who committed a move in a word (`source`, `target`, `operator`), `-` when not said. @param {any} m */
export const committedBy = (m) => (typeof m.committedBy === "string" && Object.hasOwn(committedByText, m.committedBy) ? m.committedBy : "-")

/** Who committed a move in a line, `-` when not said. @param {any} m */
export const committedByLine = (m) => committedByText[committedBy(m)] ?? "-"

/**
 * A move's outcome in one line: its phases, its verdict, or how far it got. A move whose source
 * owes a resend (`resendOwed`: it holds the guest's only copy and owes the target the stream)
 * says so; an older coordinator's move has no `resendOwed`, read as not owed. @param {any} m
 */
export const verdict = (m) => {
  if (m.state === "committed" && m.resendOwed === true) return "committed, resend owed: the source holds the only copy and owes the target the stream"
  if (m.state === "committed" && m.phases) {
    const p = m.phases
    return `committed: paused ${duration(p.downtimeMs)} (capture ${duration(p.captureMs)} · send ${duration(p.sendMs)} · commit ${duration(p.commitMs)})`
  }
  if (m.state === "aborted") {
    if (typeof m.abortEstimateMs === "number") return `refused: estimate ${duration(m.abortEstimateMs)} > budget ${duration(m.maxDowntimeMs)}`
    return `aborted: ${m.abortReason ?? "no reason given"}`
  }
  if (m.state === "committed") return "committed on a resolution: pause not measured"
  const rounds = m.rounds ?? []
  const last = rounds.at(-1)
  return rounds.length === 0 ? "starting" : `in progress: ${rounds.length} round${rounds.length === 1 ? "" : "s"}, last ${last.kind}`
}
