/**
 * Reads of records by id that arrive in the same tick go to the store together: one read of many
 * ids (`getSessions`, `getMoves`) for up to `maxGroupedReads` of them, through Effect's request
 * batching (`RequestResolver`). The waiters use it (`SessionWaiter`, `MoveWaiter`): a possible
 * miss of notices (a replica died without leaving cleanly, the LISTEN connection came back)
 * wakes every waiter at once, and thousands of waiters each reading alone put thousands of
 * statements on the pool in one instant, ahead of heartbeats and creates; waiters on distinct
 * sessions woken by changes in one tick share a read the same way.
 *
 * A read alone stays the single read it was (`getSession`, `getMove`), so an idle coordinator's
 * waiter costs what it did. Each caller gets its own record, or `NotFound` for an id the store
 * did not answer (the record is gone), as the single read fails; a failure of the grouped read
 * (`Unavailable`) fails each caller of it. The read runs in a fiber of its own: a caller that
 * goes away (its client left) leaves the group, and never cuts the read short for the others.
 */
import { NotFound } from "@engram/store"
import type { Unavailable } from "@engram/store"
import { Effect, Exit, Request, RequestResolver } from "effect"

/** The most ids one grouped read asks the store for; more in the same tick go in further reads. */
export const maxGroupedReads = 500

/** How to read records of one kind: one by id, and many by id (the found ones, in any order). */
export interface GroupedReadsOptions<A extends { readonly id: string }> {
  /** The entity a missing id is `NotFound` as. */
  readonly entity: "session" | "move"
  readonly one: (id: string) => Effect.Effect<A, NotFound | Unavailable>
  readonly many: (ids: readonly string[]) => Effect.Effect<readonly A[], Unavailable>
  /** At most this many ids per read (default `maxGroupedReads`). */
  readonly maxBatch?: number | undefined
}

/** A read of one record by id that shares the store's read with the others of its tick. */
export const make = <A extends { readonly id: string }>(options: GroupedReadsOptions<A>): ((id: string) => Effect.Effect<A, NotFound | Unavailable>) => {
  interface Read extends Request.Request<A, NotFound | Unavailable> {
    readonly id: string
  }
  const Read = Request.of<Read>()
  const resolver = RequestResolver.make<Read>((entries) => {
    if (entries.length === 1) {
      const [entry] = entries
      return Effect.map(Effect.exit(options.one(entry.request.id)), (exit) => entry.completeUnsafe(exit))
    }
    return Effect.map(Effect.exit(options.many(entries.map((e) => e.request.id))), (exit) => {
      if (Exit.isFailure(exit)) {
        const failed = Exit.failCause(exit.cause)
        for (const e of entries) e.completeUnsafe(failed)
        return
      }
      const byId = new Map(exit.value.map((r) => [r.id, r]))
      for (const e of entries) {
        const found = byId.get(e.request.id)
        e.completeUnsafe(found === undefined ? Exit.fail(new NotFound({ entity: options.entity, id: e.request.id })) : Exit.succeed(found))
      }
    })
  }).pipe(RequestResolver.batchN(options.maxBatch ?? maxGroupedReads))
  return (id) => Effect.request(Read({ id }), resolver)
}
