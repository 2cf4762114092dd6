/**
 * Lists answer pages: `{items, nextCursor}` (`@engram/api`'s `pageOf`); pass `nextCursor` back
 * as `cursor` for the next one (null on the last). `collect` follows the cursors to the end.
 */
import { Effect } from "effect"

/** One page of a list. */
export interface Page<A> {
  readonly items: readonly A[]
  readonly nextCursor: string | null
}

/** `?limit=&cursor=` of every list. */
export interface PageQuery {
  /** Items per page, 1 to 1000 (the coordinator's default: 100). */
  readonly limit?: number | undefined
  /** The `nextCursor` of the previous page. */
  readonly cursor?: string | undefined
}

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
