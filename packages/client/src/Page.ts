/**
 * Cursor pagination: every list answers `{items, nextCursor}` (pass `nextCursor` back as
 * `cursor` for the next page; null = the last page). A coordinator that answers a plain array
 * (before cursor pagination) is read as one page with `nextCursor: null`, so one client works
 * with both.
 */
import { Effect, Schema } from "effect"

/** One page of a list. */
export interface Page<A> {
  readonly items: readonly A[]
  /** The cursor of the next page; null on the last. */
  readonly nextCursor: string | null
}

/** Where a list starts and how long a page is (the coordinator caps `limit`). */
export interface PageQuery {
  readonly cursor?: string | undefined
  readonly limit?: number | undefined
}

/** The schema of a page of `item`: `{items, nextCursor}` or a plain array (one page). */
export const schema = <S extends Schema.Top>(item: S) =>
  Schema.Union([Schema.Array(item), Schema.Struct({ items: Schema.Array(item), nextCursor: Schema.NullOr(Schema.String) })])

/** A decoded answer as a page. */
export const normalize = <A>(answer: readonly A[] | { readonly items: readonly A[]; readonly nextCursor: string | null }): Page<A> =>
  Array.isArray(answer) ? { items: answer, nextCursor: null } : (answer as Page<A>)

/** Every item of a list, following cursors until the last page (`maxPages` guards a cursor that never ends). */
export const collect = <A, E, R>(fetch: (cursor: string | undefined) => Effect.Effect<Page<A>, E, R>, maxPages = 10_000): Effect.Effect<readonly A[], E, R> =>
  Effect.gen(function* () {
    const out: A[] = []
    let cursor: string | undefined = undefined
    for (let i = 0; i < maxPages; i++) {
      const page: Page<A> = yield* fetch(cursor)
      out.push(...page.items)
      if (page.nextCursor === null || page.nextCursor === cursor) break
      cursor = page.nextCursor
    }
    return out
  })
