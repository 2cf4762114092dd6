/**
 * Pages of the store's lists: the request checked and its cursor decoded with the shared
 * rules of `@engram/store` (`Validate.pageLimit`, `Cursor.decode`), and a page made from a
 * keyset read of `limit + 1` rows (`Cursor.pageOf`: one more row says there is a next page).
 */
import { Cursor, Validate } from "@engram/store"
import type { InvalidInput, PageRequest } from "@engram/store"
import { Effect } from "effect"

/** A checked page request: the key to read after (none: from the start) and how many. */
export interface Checked<L extends Cursor.List> {
  readonly after: Cursor.Keys[L] | undefined
  readonly limit: number
}

/** Checks a page request for `list`: `InvalidInput` naming `limit` or `cursor`, else the keyset bounds. */
export const check = <L extends Cursor.List>(list: L, page: PageRequest = {}): Effect.Effect<Checked<L>, InvalidInput> => {
  const bad = Validate.pageLimit(page.limit)
  if (bad) return Effect.fail(bad)
  const after = Cursor.decode(list, page.cursor)
  if (Cursor.isInvalid(after)) return Effect.fail(after)
  return Effect.succeed({ after, limit: page.limit ?? Validate.defaultPageLimit })
}
