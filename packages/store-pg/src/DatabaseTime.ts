/**
 * The database's clock as this process reads it (`StoreOptions.databaseTime`): the Effect
 * Clock's wall time (the one in context as the store opens) plus this process's offset from the database's `clock_timestamp()`.
 *
 * Several replicas stamp heartbeats, reports and reservations, and the leader judges them stale
 * against its own "now": on each replica's own clock, a replica a minute behind the others
 * stamps live hosts a minute old, and the leader reclaims their sessions (lost) though their
 * agents heartbeat on time. On the database's clock every replica stamps and judges on one
 * timeline, however far apart their own clocks are.
 *
 * A measurement reads the database's clock between two readings of this one (sent, answered):
 * the true offset lies between `db − answered` and `db − sent`. The offset kept changes only
 * when a measurement shows it outside that bracket (by more than `slackMs`), to the bracket's
 * middle: a round trip's jitter does not move it, a step of either clock does, at the next
 * measurement. One is taken at open (the store opens only once it is known) and every
 * `everyMs` after; one that fails keeps the last offset.
 */
import type { Unavailable } from "@engram/store"
import { sql } from "drizzle-orm"
import { Clock, Effect, type Scope } from "effect"
import type { Conn } from "./Db.js"

/** How often the offset is measured again (ms). */
export const defaultEveryMs = 10_000

/** How far outside a measurement's bracket the kept offset may be before it changes (ms): the database's clock reads in µs, this one in ms. */
export const slackMs = 2

/** One measurement: this clock as the query was sent and as it was answered, the database's between (epoch ms). */
export interface Reading {
  readonly sentMs: number
  readonly dbMs: number
  readonly answeredMs: number
}

/** The offset to keep after `reading` (whole ms), given the one kept so far (null: none yet). */
export const nextOffset = (kept: number | null, reading: Reading): number => {
  const low = reading.dbMs - reading.answeredMs - slackMs
  const high = reading.dbMs - reading.sentMs + slackMs
  // Whole ms: the times the store writes are integers.
  return kept !== null && kept >= low && kept <= high ? kept : Math.round(reading.dbMs - (reading.sentMs + reading.answeredMs) / 2)
}

/** The database's clock as this process reads it. */
export interface DatabaseTime {
  /** Now on the database's clock (epoch ms): the Effect Clock's wall time plus the offset. */
  readonly now: Effect.Effect<number>
  /** `now`, read at once. */
  readonly nowMs: () => number
  /** The database's clock less this process's, as last kept (ms). */
  readonly offsetMs: () => number
}

const query = sql.raw(`select (extract(epoch from clock_timestamp()) * 1000)::float8 as "dbMs"`)

/** Measures the offset on `pool` now (failing if the database does not answer), then every `everyMs` for the scope. */
export const start = (pool: Conn<Unavailable>, everyMs = defaultEveryMs): Effect.Effect<DatabaseTime, Unavailable, Scope.Scope> =>
  Effect.gen(function* () {
    const clock = yield* Clock.Clock
    let kept: number | null = null
    const measure = Effect.suspend(() => {
      const sentMs = clock.currentTimeMillisUnsafe()
      return Effect.map(pool.query<{ dbMs: number | string }>(query), (rows) => {
        const answeredMs = clock.currentTimeMillisUnsafe()
        const dbMs = Number(rows[0]?.dbMs)
        if (Number.isFinite(dbMs)) kept = nextOffset(kept, { sentMs, dbMs, answeredMs })
      })
    })
    yield* measure
    yield* Effect.forkScoped(Effect.forever(Effect.andThen(Effect.sleep(everyMs), Effect.asVoid(Effect.exit(measure)))))
    // On the clock the offset was measured against, whoever asks.
    const nowMs = () => clock.currentTimeMillisUnsafe() + (kept ?? 0)
    return {
      now: Effect.sync(nowMs),
      nowMs,
      offsetMs: () => kept ?? 0,
    }
  })
