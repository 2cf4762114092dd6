/**
 * fast-check arbitraries for the strict-input fuzzers, each case carrying what the coordinator
 * must answer, known by construction: page cursors (well-formed ones whose keys a list can or
 * cannot hold, cursors of another list, of the wrong length, or not cursors at all) and host
 * reports (valid ones, and ones with misspelt or extra keys, `allocatableMib` above `totalMib`,
 * or odd numbers, with the fields a refusal may name).
 */
import fc from "fast-check"

// ---------------------------------------------------------------------------------------------
// Cursors
// ---------------------------------------------------------------------------------------------

/** A list that pages, and what each part of its key is (SPEC: epoch ms, a history's seq, ids). */
export const lists = {
  sessions: ["ms", "id"],
  moves: ["ms", "id"],
  queue: ["ms", "id"],
  hosts: ["id"],
  reservations: ["id"],
  events: ["seq"],
} as const satisfies Record<string, readonly ("ms" | "seq" | "id")[]>

/** The name of a list that pages. */
export type List = keyof typeof lists

type Part = (typeof lists)[List][number]

/** A cursor to send to a list, and whether it names a key that list can hold (200) or not (400 naming `cursor`). */
export interface CursorCase {
  readonly list: List
  readonly cursor: string
  readonly holds: boolean
  /** What the cursor says, for a failure's message. */
  readonly says: string
}

const MAX_SEQ = 2 ** 31 - 1

const holdable: { readonly [P in Part]: fc.Arbitrary<unknown> } = {
  ms: fc.oneof(fc.maxSafeInteger(), fc.constantFrom(0, -0, Number.MAX_SAFE_INTEGER, -Number.MAX_SAFE_INTEGER, 1_796_000_000_000)),
  seq: fc.oneof(fc.integer({ min: 0, max: MAX_SEQ }), fc.constantFrom(0, 1, MAX_SEQ)),
  id: fc.oneof(fc.stringMatching(/^[A-Za-z0-9._-]{0,40}$/), fc.constantFrom("é", "👍", "a b", "\uFFFD", "z".repeat(300), "'; --")),
}

const notJsonNumbers = fc.constantFrom<unknown>(null, true, false, "1", "", [], {}, [1], { a: 1 })

const odd: { readonly [P in Part]: fc.Arbitrary<unknown> } = {
  ms: fc.oneof(
    fc.constantFrom(1.5, 0.1, -0.5, 1e19, -1e19, 1e308, -1e308, 2 ** 53, -(2 ** 53), 2 ** 63, Number.MIN_VALUE),
    fc.double({ noNaN: true, noDefaultInfinity: true }).filter((d) => !Number.isSafeInteger(d)),
    notJsonNumbers,
  ),
  seq: fc.oneof(
    fc.constantFrom(1.5, -1, 2 ** 31, 2 ** 40, 1e19, 1e308, -0.5, Number.MIN_VALUE),
    fc.double({ noNaN: true, noDefaultInfinity: true }).filter((d) => !(Number.isInteger(d) && d >= 0 && d <= MAX_SEQ)),
    notJsonNumbers,
  ),
  id: fc.constantFrom<unknown>("a\u0000b", "\u0000", "\uD800", "x\uDC00y", `${"\uDC00"}${"\uD800"}`, 7, 1.5, null, true, [], {}, ["a"]),
}

const encoded = (parts: readonly unknown[]): string => Buffer.from(JSON.stringify(parts), "utf8").toString("base64url")

/** Cursors for `list`: holdable keys (about a third), a key with an odd part, another list's name, a wrong length, or no cursor at all. */
export const cursor = (list: List): fc.Arbitrary<CursorCase> => {
  const shape = lists[list]
  const keyOf = (pick: (p: Part, i: number) => fc.Arbitrary<unknown>) => fc.tuple(...shape.map((p, i) => pick(p, i)))
  const holds = keyOf((p) => holdable[p]).map((key) => ({ list, parts: [list, ...key], holds: true }))
  const oneOdd = fc
    .integer({ min: 0, max: shape.length - 1 })
    .chain((bad) => keyOf((p, i) => (i === bad ? odd[p] : holdable[p])))
    .map((key) => ({ list, parts: [list, ...key], holds: false }))
  const otherList = fc
    .constantFrom(...(Object.keys(lists) as List[]).filter((l) => lists[l].join() !== shape.join()), "Sessions", "", "x")
    .chain((name) => keyOf((p) => holdable[p]).map((key) => ({ list, parts: [name, ...key], holds: false })))
  const wrongLength = fc
    .oneof(keyOf((p) => holdable[p]).map((key) => [...key, 1]), fc.constant([] as unknown[]))
    .map((key) => ({ list, parts: [list, ...key], holds: false }))
  const wellFormed = fc.oneof({ weight: 3, arbitrary: holds }, { weight: 4, arbitrary: oneOdd }, { weight: 1, arbitrary: otherList }, { weight: 1, arbitrary: wrongLength })
  const notCursors = fc
    .oneof(
      fc.constantFrom("", "x", "!!", "%00", "W10", "bnVsbA", "e30", "A".repeat(3000)),
      fc.string({ unit: "binary", maxLength: 40 }),
      fc.jsonValue().map((v) => encoded([v])),
    )
    .map((c) => ({ list, cursor: c, holds: false, says: JSON.stringify(c) }))
  return fc.oneof(
    { weight: 8, arbitrary: wellFormed.map((c) => ({ list: c.list, cursor: encoded(c.parts), holds: c.holds, says: JSON.stringify(c.parts) })) },
    { weight: 1, arbitrary: notCursors },
  )
}

// ---------------------------------------------------------------------------------------------
// Host reports
// ---------------------------------------------------------------------------------------------

/** The figures of a report. */
const figures = ["totalMib", "allocatableMib", "totalVcpus"] as const
type Figure = (typeof figures)[number]

/**
 * A report body (raw JSON text, so that `1e999` can be sent) and what must come of it: the
 * fields a 400 may name (any one of them: several faults may be in one body), none for a 200,
 * and for a 200 the report the host must then hold.
 */
export interface ReportCase {
  readonly body: string
  readonly faults: readonly string[]
  readonly stored: {
    readonly totalMib: number | null
    readonly allocatableMib: number | null
    readonly totalVcpus: number | null
    /** A report without templates holds none. */
    readonly templates: readonly never[]
  } | null
}

/** Misspellings of each figure's key, as an agent or a hand-written script might send them. */
const typos: Readonly<Record<Figure, readonly string[]>> = {
  totalMib: ["totalMb", "totalMiB", "TotalMib", "total_mib", "totalmib", "total", "totalMibs"],
  allocatableMib: ["allocatableMb", "allocatableMiB", "allocatable_mib", "allocatable", "allocMib", "availableMib"],
  totalVcpus: ["totalVCPUs", "totalCpus", "vcpus", "total_vcpus", "totalVcpu"],
}

const extraKeys = ["unknownField", "memMib", "labels", "id", "reservedMib", "__proto__", "constructor", ""]

/** A figure that is not one: negative, not finite, past 2^53 - 1, not a number (as JSON text). */
const oddFigure = (figure: Figure): fc.Arbitrary<string> =>
  fc.oneof(
    fc.constantFrom("-1", "-0.5", "1e999", "-1e999", "9007199254740993", "1e21", '"12"', "true", "{}", "[]", '"NaN"'),
    fc.integer({ min: -(2 ** 31), max: -1 }).map(String),
    ...(figure === "totalVcpus" ? [fc.constantFrom("1.5", "0.25", "7.000001")] : []),
  )

const validMib = fc.oneof(fc.integer({ min: 0, max: 1 << 22 }), fc.double({ min: 0, max: 1 << 20, noNaN: true, noDefaultInfinity: true }))

/**
 * What a figure's JSON text is to the coordinator: null (not measured), a number it takes (finite,
 * >= 0, exact: at most 2^53 - 1; cores whole), or a fault.
 */
const figureOf = (figure: Figure, text: string): number | null | "fault" => {
  const v: unknown = JSON.parse(text)
  if (v === null) return null
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0 || v > Number.MAX_SAFE_INTEGER) return "fault"
  return figure === "totalVcpus" && !Number.isInteger(v) ? "fault" : v
}

/** The fields a refusal of this body may name (none: it is accepted), and the report a host then holds. */
const judge = (entries: ReadonlyMap<string, string>): Pick<ReportCase, "faults" | "stored"> => {
  // An unknown key is named as sent; the empty key as `""`.
  const faults = [...entries.keys()].filter((k) => !(figures as readonly string[]).includes(k)).map((k) => (k === "" ? '""' : k))
  const read = {} as Record<Figure, number | null>
  for (const f of figures) {
    const text = entries.get(f)
    const v = text === undefined ? null : figureOf(f, text)
    if (v === "fault") faults.push(f)
    read[f] = v === "fault" ? null : v
  }
  if (read.totalMib !== null && read.allocatableMib !== null && read.allocatableMib > read.totalMib) faults.push("allocatableMib")
  return { faults, stored: faults.length === 0 ? { ...read, templates: [] } : null }
}

/** Reports for a host: valid ones, and ones with misspelt or extra keys, allocatable above total, or odd figures, alone or together. */
export const report: fc.Arbitrary<ReportCase> = fc
  .record({
    total: fc.option(validMib, { freq: 6 }),
    allocatableShare: fc.double({ min: 0, max: 1, noNaN: true }),
    allocatableNull: fc.boolean(),
    vcpus: fc.option(fc.integer({ min: 0, max: 512 }), { freq: 6 }),
    absent: fc.subarray([...figures], { maxLength: 2 }),
    faults: fc.subarray(["typo", "extra", "overAllocated", "odd"] as const, { maxLength: 2 }),
    typoOf: fc.constantFrom(...figures),
    typoPick: fc.nat(),
    extra: fc.constantFrom(...extraKeys),
    overBy: fc.oneof(fc.integer({ min: 1, max: 1 << 30 }), fc.constantFrom(0.5, 1e-6, 500_000)),
    oddOf: fc.constantFrom(...figures),
  })
  .chain((r) => oddFigure(r.oddOf).map((oddValue) => ({ ...r, oddValue })))
  .map((r): ReportCase => {
    const value: Record<Figure, number | null> = {
      totalMib: r.total,
      allocatableMib: r.total === null || r.allocatableNull ? null : Math.floor(r.total * r.allocatableShare),
      totalVcpus: r.vcpus,
    }
    if (r.faults.includes("overAllocated") && r.total !== null) value.allocatableMib = r.total + r.overBy
    const entries = new Map<string, string>()
    for (const f of figures) if (!r.absent.includes(f)) entries.set(f, JSON.stringify(value[f]))
    if (r.faults.includes("odd")) entries.set(r.oddOf, r.oddValue)
    if (r.faults.includes("typo") && entries.has(r.typoOf)) {
      const list = typos[r.typoOf]
      entries.set(list[r.typoPick % list.length] as string, entries.get(r.typoOf) as string)
      entries.delete(r.typoOf)
    }
    if (r.faults.includes("extra")) entries.set(r.extra, "1")
    const body = `{${[...entries].map(([k, v]) => `${JSON.stringify(k)}:${v}`).join(",")}}`
    return { body, ...judge(entries) }
  })
