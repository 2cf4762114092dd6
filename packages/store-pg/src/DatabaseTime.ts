/**
 * The database's clock as this process reads it (`PgOptions.databaseTime`): the Effect Clock's
 * monotonic time (the clock in context as the store opens) plus its offset from the database's
 * `clock_timestamp()`. On the monotonic clock, a step of this process's wall clock (NTP, an
 * operator) does not move the store's time at all; a step of the database's moves it at the next
 * measurement, as it moves every replica's (the reaper's failover grace sees a step forward as a
 * gap: its contacts are on the store's time).
 *
 * Several replicas stamp heartbeats, reports and reservations, and the leader judges them stale
 * against its own "now": on each replica's own clock, a replica a minute behind the others
 * stamps live hosts a minute old, and the leader reclaims their sessions (lost) though their
 * agents heartbeat on time. On the database's clock every replica stamps and judges on one
 * timeline, however far apart their own clocks are.
 *
 * A measurement reads the database's clock between two readings of this one (sent, answered):
 * the true offset lies between `db − answered` and `db − sent`. The first is the bracket's
 * middle; after it, the offset kept changes only when a measurement shows it outside that
 * bracket (by more than `slackMs`), and then to the bracket's nearer edge: a round trip's jitter
 * does not move it, a step of the database's clock moves it as little as the reading allows. One
 * is taken at open (the store opens only once it is known) and every `everyMs` after; one that
 * fails, or takes longer than `measureBoundMs`, keeps the last offset.
 */
import { Unavailable } from "@engram/store"
import { sql } from "drizzle-orm"
import { Clock, Deferred, Duration, Effect, type Scope } from "effect"
import type { Conn } from "./Db.js"

/** How often the offset is measured again (ms). */
export const defaultEveryMs = 10_000

/** How far outside a measurement's bracket the kept offset may be before it changes (ms): the database's clock reads in µs, this one in ms. */
export const slackMs = 2

/** A measurement that takes longer than this (ms) is given up: the offset stays as it was. */
export const measureBoundMs = 5_000

/** One measurement: this clock as the query was sent and as it was answered (its monotonic ms), the database's between (epoch ms). */
export interface Reading {
  readonly sentMs: number
  readonly dbMs: number
  readonly answeredMs: number
}

/** The offset to keep after `reading` (whole ms), given the one kept so far (null: none yet). */
export const nextOffset = (kept: number | null, reading: Reading): number => {
  // Whole ms: the times the store writes are integers.
  if (kept === null) return Math.round(reading.dbMs - (reading.sentMs + reading.answeredMs) / 2)
  const low = reading.dbMs - reading.answeredMs - slackMs
  const high = reading.dbMs - reading.sentMs + slackMs
  return kept < low ? Math.ceil(low) : kept > high ? Math.floor(high) : kept
}

/** The database's clock as this process reads it. */
export interface DatabaseTime {
  /** Now on the database's clock (epoch ms): the Effect Clock's monotonic time plus the offset. */
  readonly now: Effect.Effect<number>
  /** `now`, read at once. */
  readonly nowMs: () => number
  /** The database's clock less this process's monotonic clock, as last kept (ms). */
  readonly offsetMs: () => number
}

const query = sql.raw(`select (extract(epoch from clock_timestamp()) * 1000)::float8 as "dbMs"`)

/** A change of this process's wall clock less its monotonic one (ms) that asks for a measurement at once (`start`). */
export const driftMs = 1_000

/** How many readings the first offset is chosen from (the one of the shortest round trip). */
export const firstReadings = 3

/** How soon (ms) a measurement that failed is tried again. */
export const retryMs = 1_000

/**
 * Measures the offset on `pool` now (failing if the database does not answer), then every
 * `everyMs` for the scope (`retryMs` after one that failed), and at once when this process's wall
 * clock and monotonic clock part by more than `driftMs` (a suspended machine's monotonic clock
 * stands still; a wall step parts them too): the store's time would otherwise lag the database's
 * by the suspend until the next one. Until that measurement has ended (at most `measureBoundMs`),
 * `now` waits for it, so no heartbeat is stamped in the past after a resume (`nowMs`, read at
 * once, does not wait). The first offset comes from the shortest of `firstReadings` round trips
 * (those that answered: the open fails only if none did), taken on a connection opened first (a
 * first connect, bounded by the pool's own connect timeout, is no part of any).
 */
export const start = (pool: Conn<Unavailable>, everyMs = defaultEveryMs): Effect.Effect<DatabaseTime, Unavailable, Scope.Scope> =>
  Effect.gen(function* () {
    const clock = yield* Clock.Clock
    const monoMs = () => Number(clock.monotonicTimeNanosUnsafe() / 1_000_000n)
    /** The wall clock less the monotonic one as the last reading that answered was sent. */
    let parted = clock.currentTimeMillisUnsafe() - monoMs()
    /** Done to end the wait for the next measurement early. */
    let woken = Deferred.makeUnsafe<void>()
    /** Done when the measurement a parting of the clocks asked for has ended; null when none is asked. */
    let asked: Deferred.Deferred<void> | null = null
    let lastFailed = false
    const unreadable = (what: string) => new Unavailable({ reason: `the database's clock: ${what}`, retryAfterMs: 1000 })
    const read = Effect.suspend(() => {
      const sentMs = monoMs()
      const partedAtSend = clock.currentTimeMillisUnsafe() - sentMs
      return pool.query<{ dbMs: number | string }>(query).pipe(
        Effect.timeoutOrElse({ duration: Duration.millis(measureBoundMs), orElse: () => Effect.fail(unreadable(`no answer within ${measureBoundMs} ms`)) }),
        Effect.flatMap((rows) => {
          const answeredMs = monoMs()
          const dbMs = Number(rows[0]?.dbMs)
          if (!Number.isFinite(dbMs)) return Effect.fail(unreadable(`clock_timestamp() read as ${String(rows[0]?.dbMs)}`))
          parted = partedAtSend
          return Effect.succeed({ sentMs, dbMs, answeredMs } satisfies Reading)
        }),
      )
    })
    // The store opens only once the offset is known: a connection opened first, then the readings.
    yield* pool.query(sql`select 1`)
    const readings: Reading[] = []
    let lastError: Unavailable | null = null
    for (let i = 0; i < firstReadings; i++) {
      const r = yield* Effect.result(read)
      if (r._tag === "Success") readings.push(r.success)
      else lastError = r.failure
    }
    const shortest = readings.reduce<Reading | null>((a, b) => (a === null || b.answeredMs - b.sentMs < a.answeredMs - a.sentMs ? b : a), null)
    if (shortest === null) return yield* (lastError ?? unreadable("no reading"))
    let kept = nextOffset(null, shortest)
    const measure = Effect.exit(read).pipe(
      Effect.map((r) => {
        lastFailed = r._tag === "Failure"
        if (r._tag === "Success") kept = nextOffset(kept, r.value)
        // The measurement a parting asked for has ended, answered or not: `now` waits no longer.
        const done = asked
        asked = null
        if (done !== null) Deferred.doneUnsafe(done, Effect.void)
      }),
    )
    const next = Effect.suspend(() => Effect.race(Effect.sleep(lastFailed ? retryMs : everyMs), Deferred.await(woken))).pipe(
      Effect.andThen(
        Effect.sync(() => {
          woken = Deferred.makeUnsafe<void>()
        }),
      ),
    )
    yield* Effect.forkScoped(Effect.forever(Effect.andThen(next, measure)))
    /** Asks for a measurement at once when the clocks have parted since the last reading; answers now's monotonic ms. */
    const looked = (): number => {
      const mono = monoMs()
      const partedNow = clock.currentTimeMillisUnsafe() - mono
      if (Math.abs(partedNow - parted) > driftMs) {
        parted = partedNow
        asked ??= Deferred.makeUnsafe<void>()
        Deferred.doneUnsafe(woken, Effect.void)
      }
      return mono
    }
    // On the clock the offset was measured against, whoever asks.
    const nowMs = () => looked() + kept
    return {
      now: Effect.suspend(() => {
        const mono = looked()
        // A parting asked for a measurement: the time is read once it has ended (at most `measureBoundMs`).
        return asked === null ? Effect.succeed(mono + kept) : Effect.andThen(Effect.ignore(Effect.timeout(Deferred.await(asked), Duration.millis(measureBoundMs))), Effect.sync(() => monoMs() + kept))
      }),
      nowMs,
      offsetMs: () => kept,
    }
  })
