/**
 * Host shapes from the command line and from a hosts file: `COUNTxMEMxVCPUS`, where MEM is
 * MiB, or GiB / TiB with a `g` / `t` suffix (`200x64gx16`: 200 hosts of 64 GiB and 16 cores).
 * A hosts file holds one shape per line, in that syntax or as `count,memMib,vcpus` (CSV, a
 * header line allowed); blank lines and `#` comments are skipped.
 */
import type { HostShape } from "./Simulation.js"

/** A shape that could not be read: what was wrong, and where (line 0 for a flag). */
export interface ShapeIssue {
  readonly line: number
  readonly message: string
}

const amountMib = (raw: string): number | null => {
  const m = /^(\d+(?:\.\d+)?)([gGtT]?)$/.exec(raw.trim())
  if (m === null) return null
  const n = Number(m[1])
  const unit = (m[2] ?? "").toLowerCase()
  const mib = unit === "g" ? n * 1024 : unit === "t" ? n * 1024 * 1024 : n
  return Number.isInteger(mib) && mib > 0 ? mib : null
}

const positiveInt = (raw: string): number | null => {
  const t = raw.trim()
  return /^\d+$/.test(t) && Number(t) > 0 ? Number(t) : null
}

/** Reads one shape (`COUNTxMEMxVCPUS` or `count,memMib,vcpus`). */
export const parseShape = (raw: string): HostShape | string => {
  const parts = raw.includes(",") ? raw.split(",") : raw.toLowerCase().split("x")
  if (parts.length !== 3) return `expected COUNTxMEMxVCPUS (e.g. 200x64gx16) or count,memMib,vcpus (got ${JSON.stringify(raw)})`
  const count = positiveInt(parts[0] as string)
  const memMib = amountMib(parts[1] as string)
  const vcpus = positiveInt(parts[2] as string)
  if (count === null) return `the host count must be a positive integer (got ${JSON.stringify(parts[0])})`
  if (memMib === null) return `the RAM must be a positive whole number of MiB, or GiB/TiB with g/t (got ${JSON.stringify(parts[1])})`
  if (vcpus === null) return `the cores must be a positive integer (got ${JSON.stringify(parts[2])})`
  return { count, memMib, vcpus }
}

/** Reads a hosts file: every shape, or the first line that is wrong. */
export const parseHostsFile = (text: string): readonly HostShape[] | ShapeIssue => {
  const shapes: HostShape[] = []
  const lines = text.split("\n")
  for (let k = 0; k < lines.length; k++) {
    const line = (lines[k] as string).replace(/#.*$/, "").trim()
    if (line === "") continue
    // A CSV header names its columns.
    if (shapes.length === 0 && /^[a-z_ ,]+$/i.test(line) && line.includes(",")) continue
    const shape = parseShape(line)
    if (typeof shape === "string") return { line: k + 1, message: shape }
    shapes.push(shape)
  }
  if (shapes.length === 0) return { line: 0, message: "the hosts file names no host" }
  return shapes
}
