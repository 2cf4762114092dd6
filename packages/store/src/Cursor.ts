/**
 * Page cursors: every list pages by a stable key (`[createdAt, id]`, `[id]`, `[queuedAt, id]`,
 * `[seq]`), and its cursor is the key of the last item of a page, named for its list and
 * encoded opaque (base64url of JSON). Both stores encode and decode here, so a cursor of one
 * backend's list reads the same as another's, and a cursor that is not one of this list's is
 * refused with the same `InvalidInput` naming `cursor`.
 */
import { InvalidInput } from "./Errors.js"
import { defaultPageLimit, text } from "./Validate.js"

/** The lists that page, each with the shape of its key. */
export interface Keys {
  /** Sessions, oldest first: `[createdAt, id]`. */
  readonly sessions: readonly [number, string]
  /** Hosts by id. */
  readonly hosts: readonly [string]
  /** Reservations by id. */
  readonly reservations: readonly [string]
  /** Moves, oldest first: `[createdAt, id]`. */
  readonly moves: readonly [number, string]
  /** The queue, first in first out: `[queuedAt, id]`. */
  readonly queue: readonly [number, string]
  /** A session's history: `[seq]`. */
  readonly events: readonly [number]
}

/** The name of a list that pages. */
export type List = keyof Keys

/**
 * What each part of a key may be. A cursor is made only by `encode`, from stored keys, so a
 * part outside its column's range is not one of the list's cursors: it is refused here, before
 * a database is asked to compare a column with it. Times are epoch milliseconds (integers a
 * 64-bit column holds exactly), a history's `seq` a 32-bit integer, ids text without NUL or a
 * lone surrogate.
 */
type Part = "ms" | "seq" | "id"

const shapes: { readonly [L in List]: readonly Part[] } = {
  sessions: ["ms", "id"],
  hosts: ["id"],
  reservations: ["id"],
  moves: ["ms", "id"],
  queue: ["ms", "id"],
  events: ["seq"],
}

const MAX_SEQ = 2 ** 31 - 1

const isPart = (kind: Part, v: unknown): boolean => {
  switch (kind) {
    case "ms":
      return Number.isSafeInteger(v)
    case "seq":
      return Number.isInteger(v) && (v as number) >= 0 && (v as number) <= MAX_SEQ
    case "id":
      return text("cursor", v) === null
  }
}

/** The cursor of a page that ends with the item whose key is `key`. */
export const encode = <L extends List>(list: L, key: Keys[L]): string =>
  Buffer.from(JSON.stringify([list, ...key]), "utf8").toString("base64url")

const bad = (list: List) => new InvalidInput({ field: "cursor", rule: `must be a nextCursor of a previous page of ${list}` })

/** The key a cursor names, or `InvalidInput` naming `cursor` when it is not a cursor of `list`. Undefined: from the start. */
export const decode = <L extends List>(list: L, cursor: string | undefined): Keys[L] | undefined | InvalidInput => {
  if (cursor === undefined) return undefined
  if (!/^[A-Za-z0-9_-]{1,2048}$/.test(cursor)) return bad(list)
  let parsed: unknown
  try {
    parsed = JSON.parse(Buffer.from(cursor, "base64url").toString("utf8"))
  } catch {
    return bad(list)
  }
  const shape = shapes[list]
  if (!Array.isArray(parsed) || parsed.length !== shape.length + 1 || parsed[0] !== list) return bad(list)
  const key = parsed.slice(1)
  for (const [i, kind] of shape.entries()) if (!isPart(kind, key[i])) return bad(list)
  return key as unknown as Keys[L]
}

/** Whether `decode` refused. */
export const isInvalid = (x: unknown): x is InvalidInput => x instanceof InvalidInput

/**
 * The page of `sorted` (already in the list's order, and filtered) after `after`: up to
 * `limit` items and the cursor of the next page (null on the last). For stores that hold the
 * whole list in memory; a database pages with its own keyset query and `pageOf`.
 */
export const slice = <A, L extends List>(
  list: L,
  sorted: readonly A[],
  keyOf: (a: A) => Keys[L],
  after: Keys[L] | undefined,
  limit: number = defaultPageLimit,
): { readonly items: readonly A[]; readonly nextCursor: string | null } => {
  let start = 0
  if (after !== undefined) {
    // The first item whose key is after the cursor's (binary search: the list is sorted by key).
    let lo = 0
    let hi = sorted.length
    while (lo < hi) {
      const mid = (lo + hi) >>> 1
      if (compare(keyOf(sorted[mid] as A), after) <= 0) lo = mid + 1
      else hi = mid
    }
    start = lo
  }
  return pageOf(list, sorted.slice(start, start + limit + 1), keyOf, limit)
}

/**
 * A page from up to `limit + 1` items read after the cursor: the first `limit`, and a next
 * cursor only when there was one more (so the last page says so without another read).
 */
export const pageOf = <A, L extends List>(
  list: L,
  read: readonly A[],
  keyOf: (a: A) => Keys[L],
  limit: number = defaultPageLimit,
): { readonly items: readonly A[]; readonly nextCursor: string | null } => {
  const items = read.slice(0, limit)
  const last = items[items.length - 1]
  return { items, nextCursor: read.length > limit && last !== undefined ? encode(list, keyOf(last)) : null }
}

/** Orders two keys of one list: numbers as numbers, strings by code unit (as the stores sort ids). */
export const compare = (a: readonly (number | string)[], b: readonly (number | string)[]): number => {
  for (let i = 0; i < a.length; i++) {
    const x = a[i] as number | string
    const y = b[i] as number | string
    if (x < y) return -1
    if (x > y) return 1
  }
  return 0
}
