/**
 * The placement cache: the committed host rows this store has seen (a full read, a
 * placement's answer, a re-read of a host), the newest version of each, with core's candidate
 * for it and core's placement index over them. A row read inside a transaction that may
 * still roll back is never kept: a version seen only there may be reused. Full reads are
 * shared through Effect's request batching: callers that need fresh figures while a read is
 * in flight join the one read queued behind it, so concurrent placements cause one read per
 * round trip, not one each. The cache decides nothing: core's index picks, and the version a
 * placement writes against keeps it safe.
 */
import { PlacementIndex, QueueWalk } from "@engram/core"
import type { FleetHost, Limits } from "@engram/core"
import type { Unavailable } from "@engram/store"
import { Deferred, Effect, Exit, Request, RequestResolver, Semaphore } from "effect"
import { query } from "./Db.js"
import type { Exec } from "./Db.js"
import { readRoom, roomChangedSql, toCandidate, toRoomRow } from "./Room.js"
import type { RoomRow } from "./Room.js"

/** A known host: its newest committed row and core's candidate for it. */
export interface Known {
  readonly row: RoomRow
  readonly candidate: FleetHost
}

/** The cache's operations. */
export interface PlacementCache {
  /** The known row of a host. */
  readonly get: (id: string) => Known | undefined
  /** Every known host as core sees it. */
  readonly candidates: () => FleetHost[]
  /** Keeps a committed row unless a newer version is known. */
  readonly learn: (row: RoomRow) => void
  /** Forgets a host (removed): it is no candidate until a read shows it again. */
  readonly forget: (id: string) => void
  /**
   * Core's walk of `queue` (in order) over the known hosts, each placement taking its room
   * before the next is judged (`QueueWalk.walkOn`): a batch of creates decided on one read.
   * The known rows are left as they were (the placements are not written yet).
   */
  readonly plan: <W extends QueueWalk.Waiting>(queue: readonly W[]) => QueueWalk.Walk<W>
  /** Whether the last full read is recent enough to place from (`maxReadAgeMs`). */
  readonly isRecent: () => boolean
  /** Forgets the last read's age: the next placement reads again. Called around every write that may change room. */
  readonly stale: () => void
  /** Forgets everything (a test reset) and decides with `limits` from now on. */
  readonly reset: (limits: Limits.Limits) => void
  /** Every host's room read afresh, by a read that started at or after `since` (real ms). */
  readonly readAll: (since: number) => Effect.Effect<void, Unavailable>
}

/** Builds the cache over a reader of single statements (`Db.run` with its errors mapped). */
export const make = (options: {
  readonly limits: Limits.Limits
  readonly maxReadAgeMs: number
  readonly read: <A>(body: (exec: Exec) => Promise<A>) => Effect.Effect<A, Unavailable>
}): PlacementCache => {
  let limits = options.limits
  const { maxReadAgeMs, read } = options
  let known = new Map<string, Known>()
  // Core's placement index over the known hosts: picks in O(log n).
  let index = new PlacementIndex.Index(limits)
  // Bumped by a reset: a read that started before it must not fill `known` after it.
  let generation = 0
  // When the last full read started (real time, not the Clock).
  let knownAt = Number.NEGATIVE_INFINITY

  const learn = (row: RoomRow): void => {
    const k = known.get(row.id)
    if (k !== undefined && row.version < k.row.version) return
    const candidate = toCandidate(row, limits)
    known.set(row.id, { row, candidate })
    index.upsert(candidate)
  }
  const unlearn = (id: string): void => {
    known.delete(id)
    index.remove(id)
  }

  /** Every host's room, read afresh (no transaction, no lock): the maintained sums, no aggregation. */
  const readAllOnce: Effect.Effect<void, Unavailable> = Effect.suspend(() => {
    const gen = generation
    const startedAt = performance.now()
    if (known.size === 0)
      return Effect.map(read((exec) => readRoom(exec, { columns: "room" })), (rows) => {
        if (gen !== generation) return
        const seen = new Set<string>()
        for (const r of rows) {
          seen.add(r.id)
          learn(r)
        }
        for (const id of [...known.keys()]) if (!seen.has(id)) unlearn(id)
        knownAt = startedAt
      })
    // Only the hosts whose version changed since we knew them (a host at the same version is
    // the same row): as fresh as a full read, with less to send and decode.
    const versions: Record<string, number> = {}
    for (const [id, k] of known) versions[id] = k.row.version
    return Effect.map(
      read((exec) => query<Record<string, unknown>>(exec, roomChangedSql(versions))),
      (rows) => {
        if (gen !== generation) return
        for (const r of rows) learn(toRoomRow(r))
        knownAt = startedAt
      },
    )
  })

  // The shared full read: one read at a time; callers arriving while it runs wait for the
  // next, which starts after them (a batch of Effect's request batching, run when the reader
  // is free); a caller content with an older read joins the one in flight.
  interface ReadRoom extends Request.Request<void, Unavailable> {
    readonly since: number
  }
  const ReadRoom = Request.of<ReadRoom>()
  const reader = Semaphore.makeUnsafe(1)
  let inFlight: { readonly startedAt: number; readonly done: Deferred.Deferred<void, Unavailable> } | null = null
  const readResolver = RequestResolver.makeWith<ReadRoom>({
    batchKey: () => "room",
    delay: Effect.andThen(Effect.yieldNow, reader.withPermits(1)(Effect.void)),
    collectWhile: () => true,
    runAll: (entries) =>
      reader.withPermits(1)(
        Effect.suspend(() => {
          const current = { startedAt: performance.now(), done: Deferred.makeUnsafe<void, Unavailable>() }
          inFlight = current
          return Effect.exit(readAllOnce).pipe(
            Effect.map((exit) => {
              Deferred.doneUnsafe(current.done, exit)
              for (const e of entries) e.completeUnsafe(exit)
            }),
            // Whatever ends the read (an interruption too), those who joined it are answered.
            Effect.ensuring(
              Effect.sync(() => {
                if (inFlight === current) inFlight = null
                Deferred.doneUnsafe(current.done, Exit.interrupt())
              }),
            ),
          )
        }),
      ),
  })

  return {
    get: (id) => known.get(id),
    candidates: () => [...known.values()].map((k) => k.candidate),
    learn,
    forget: (id) => unlearn(id),
    plan: (queue) => {
      const walk = QueueWalk.walkOn(index, queue)
      // The walk took each placement's room out of the index: put the known rows back.
      for (const p of walk.placed) {
        const k = known.get(p.hostId)
        if (k !== undefined) index.upsert(k.candidate)
      }
      return walk
    },
    isRecent: () => maxReadAgeMs > 0 && performance.now() - knownAt <= maxReadAgeMs,
    stale: () => {
      knownAt = Number.NEGATIVE_INFINITY
    },
    reset: (next) => {
      limits = next
      known = new Map()
      index = new PlacementIndex.Index(limits)
      knownAt = Number.NEGATIVE_INFINITY
      generation++
    },
    readAll: (since) =>
      Effect.suspend(() => {
        const current = inFlight
        if (current !== null && current.startedAt >= since) return Deferred.await(current.done)
        return Effect.request(ReadRoom({ since }), readResolver)
      }),
  }
}

