/**
 * How the CLI shows figures to a person and reads them back: RAM in MiB/GiB/TiB, durations,
 * aligned tables (numbers right-aligned), and the units a flag accepts (`--mem 1GiB`; `1GB` is
 * refused: the unit must be 1024-based,
 * `--max-downtime 600ms`). Pure functions.
 */
import { Names } from "@engram/core"

/** RAM for a person: `512 MiB`, `1.5 GiB`, `12 GiB`, `2 TiB`. */
export const mib = (n: number | null | undefined): string => {
  if (n === null || n === undefined || !Number.isFinite(n)) return "-"
  const abs = Math.abs(n)
  const trim = (x: number) => (Number.isInteger(x) ? String(x) : x.toFixed(1).replace(/\.0$/, ""))
  if (abs >= 1024 * 1024) return `${trim(n / (1024 * 1024))} TiB`
  if (abs >= 1024) return `${trim(n / 1024)} GiB`
  return `${trim(n)} MiB`
}

/** A number of vCPUs: `1 vCPU`, `4 vCPUs`. */
export const vcpus = (n: number | null | undefined): string => (n === null || n === undefined ? "-" : `${n} vCPU${n === 1 ? "" : "s"}`)

/** A duration for a person: `850 ms`, `12s`, `3m 05s`, `2h 10m`, `3d 4h`. */
export const duration = (ms: number): string => {
  if (!Number.isFinite(ms) || ms < 0) return "-"
  if (ms < 1000) return `${Math.round(ms)} ms`
  const s = Math.floor(ms / 1000)
  if (s < 60) return `${s}s`
  const m = Math.floor(s / 60)
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`
  const h = Math.floor(m / 60)
  if (h < 48) return `${h}h ${String(m % 60).padStart(2, "0")}m`
  return `${Math.floor(h / 24)}d ${h % 24}h`
}

/** A cell that reads as a number (right-aligned): `12`, `1.5 GiB`, `3/4`, `-`. */
const numeric = (s: string) => /^-?[0-9][0-9.,]*(\s?(MiB|GiB|TiB|ms|s|%))?(\/-?[0-9][0-9.,]*(\s?(MiB|GiB|TiB))?)?$/.test(s) || s === "-"

/** The width a terminal gives a string (no ANSI codes are used in cells). */
const width = (s: string) => [...s].length

/** An aligned table: a header row, then the rows; numeric columns right-aligned, two spaces between. */
export const table = (headers: readonly string[], rows: readonly (readonly string[])[]): string => {
  if (rows.length === 0) return headers.join("  ")
  const widths = headers.map((h, i) => Math.max(width(h), ...rows.map((r) => width(r[i] ?? ""))))
  const right = headers.map((_, i) => rows.every((r) => numeric(r[i] ?? "-")))
  const line = (cells: readonly string[]) =>
    cells
      .map((c, i) => {
        const w = widths[i] ?? 0
        const pad = " ".repeat(Math.max(0, w - width(c)))
        return right[i] === true ? pad + c : i === cells.length - 1 ? c : c + pad
      })
      .join("  ")
      .trimEnd()
  return [line(headers), ...rows.map(line)].join("\n")
}

/** Key–value lines with the keys aligned. */
export const fields = (pairs: readonly (readonly [string, string])[]): string => {
  const w = Math.max(0, ...pairs.map(([k]) => width(k)))
  return pairs.map(([k, v]) => `${k.padEnd(w)}  ${v}`).join("\n")
}

/**
 * Reads a RAM size: a plain number is MiB; `m`/`MiB`, `g`/`GiB`, `t`/`TiB` (1024-based,
 * case-insensitive). `MB`, `GB`, `TB` are refused (null): they are 1000-based elsewhere, and
 * `1GB` read as 1 GiB would reserve 7% more than a person meant by it (or less than a guest sized
 * in GiB needs, read as 10^9 bytes): the unit must say 1024.
 */
export const parseMib = (text: string): number | null => {
  const m = /^\s*([0-9]+(?:\.[0-9]+)?)\s*(m|mib|g|gib|t|tib)?\s*$/i.exec(text)
  if (m === null || m[1] === undefined) return null
  const n = Number(m[1])
  const unit = (m[2] ?? "m").toLowerCase()
  const factor = unit.startsWith("t") ? 1024 * 1024 : unit.startsWith("g") ? 1024 : 1
  const value = n * factor
  return Number.isFinite(value) && value > 0 && Number.isInteger(value) ? value : null
}

/** Reads a whole number above 0 by core's one rule for integers read from text: `1e3` and `0x10` are refused. */
export const parseWhole = (text: string): number | null => {
  const t = text.trim()
  if (!Names.decimalInt.test(t) || !/^[0-9]/.test(t)) return null
  const n = Number(t)
  return n > 0 ? n : null
}

/** Reads a duration: a plain number is ms; `ms`, `s`, `m`, `h`. */
export const parseMs = (text: string): number | null => {
  const m = /^\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m|h)?\s*$/i.exec(text)
  if (m === null || m[1] === undefined) return null
  const n = Number(m[1])
  const unit = (m[2] ?? "ms").toLowerCase()
  const factor = unit === "h" ? 3_600_000 : unit === "m" ? 60_000 : unit === "s" ? 1000 : 1
  const value = Math.round(n * factor)
  return Number.isFinite(value) && value > 0 ? value : null
}

/** How long ago `at` (epoch ms) was, from `now`. */
export const age = (at: number | null | undefined, now: number): string => (at === null || at === undefined ? "-" : duration(Math.max(0, now - at)))

/**
 * An event's own fields as `key=value` (`cause=idle reason=demand`), without `seq`, `at`,
 * `kind`, `sessionId` and `hostId` (their own columns); a field without a value (the gate's
 * `reason` of an idle descent) is left out, not shown as `null`.
 */
export const details = (event: Readonly<Record<string, unknown>>): string =>
  Object.entries(event)
    .filter(([k, v]) => !["seq", "at", "kind", "sessionId", "hostId"].includes(k) && v !== null && v !== undefined)
    .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`)
    .join(" ")
