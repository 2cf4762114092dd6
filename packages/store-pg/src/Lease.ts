/**
 * Leadership on PostgreSQL (SPEC §13), `@engram/store`'s `Leadership`: a lease row per name
 * (`leases`: holder, epoch, renewals, the holder's lease duration). Time is the monotonic time
 * of Effect's `Clock` (a step of the wall clock moves no deadline); no two replicas' clocks are
 * compared, as in client-go's leaderelection (each check also measures the wall clock against
 * the database's, `clockSkewMs`, for the operator):
 *
 * - the holder renews by bumping `renewals` where it is still the holder at its epoch; it acts
 *   only until `renewDeadlineMs` after its last renewal, so a holder that cannot renew (frozen,
 *   cut off, its queries timing out) stops by itself, before anyone may take over. Past that
 *   deadline it renews only after reading the row as still its own (a compare-and-set on the
 *   renewals it read), and a query that times out past the deadline gives the lease up: on a
 *   link slower than the query timeout its renewals would commit while it gave up waiting for
 *   each, the row would go on changing and nobody would lead (walkthrough: 2 s each way). It then
 *   waits as any other replica, from its last confirmed renewal. The lease's connection carries a
 *   `statement_timeout` of the query timeout, which bounds how long the server may hold a renewal
 *   (behind a lock, say) before cancelling it; one sent over a slow link may still land up to
 *   that link's delay after the holder gave up on it, which the fencing makes harmless;
 * - every other replica watches the row: a change (a renewal, a new holder) restarts its wait;
 *   a row unchanged for the holder's whole `leaseDurationMs`, as this replica's clock measures
 *   it, is taken over with a compare-and-set on what it saw, at the next epoch;
 * - the holder's writes carry its epoch (`fence`, checked by the apply: `Fence.ts`), so a holder
 *   that wakes up after a takeover changes nothing, even mid-transaction.
 *
 * Giving the lease up (scope end) sets its duration to 0: another replica takes over at its
 * next look. Stepping down (`stepDown`: a leader whose store calls keep failing) does the same
 * but not for good: the replica watches the lease and takes it again only after `standAgain`.
 *
 * The holder also writes its internal address (`advertise`) with every renewal, and every other
 * replica reads it with its watch (`leaderUrl`): the coordinator's replicas forward their
 * creates to the holder there (its placer). Nothing else reads it. Likewise a fingerprint of
 * its admin token (`adminTokenHash`, read as `leaderAdminTokenHash`): replicas that must share
 * one compare theirs with the holder's.
 */
import { checkLeaseTimes, defaultLeaseTimes, type Fence, Leadership, type LeadershipShape, type LeaseTimes, type Unavailable } from "@engram/store"
import { sql } from "drizzle-orm"
import { Cause, Clock, Duration, Effect, Layer, type Scope, Semaphore } from "effect"
import type { Db } from "./Db.js"
import * as PostgresJs from "./PostgresJs.js"

export interface LeaseOptions extends Partial<LeaseTimes> {
  /** This replica: unique among the replicas (default: a random id). */
  readonly holder?: string | undefined
  /** The lease (default `reaper`). */
  readonly name?: string | undefined
  /** The longest a lease query may take before it counts as failed (default 2 s). */
  readonly queryTimeoutMs?: number | undefined
  /** This replica's internal address, written with the lease while it holds it (read at each write; null: none yet). */
  readonly advertise?: (() => string | null) | undefined
  /** A fingerprint of this replica's admin token, written with the lease while it holds it (read at each write; null: none). */
  readonly adminTokenHash?: (() => string | null) | undefined
}

const defaultQueryTimeoutMs = 2000

interface Row {
  readonly holder: string
  readonly epoch: number
  readonly renewals: number
  readonly durationMs: number
  readonly url: string | null
  readonly adminTokenHash: string | null
}

const rowOf = (r: Record<string, unknown> | undefined): Row | null =>
  r === undefined
    ? null
    : {
        holder: String(r["holder"]),
        epoch: Number(r["epoch"]),
        renewals: Number(r["renewals"]),
        durationMs: Number(r["lease_duration_ms"]),
        url: typeof r["url"] === "string" ? r["url"] : null,
        adminTokenHash: typeof r["admin_token_hash"] === "string" ? r["admin_token_hash"] : null,
      }

/** Leadership through the `leases` row of `options.name` on `db`; given up when the scope closes. */
export const make = (db: Db, options: LeaseOptions = {}): Effect.Effect<
  LeadershipShape & {
    readonly holder: string
    readonly leaderUrl: () => string | null
    readonly leaderAdminTokenHash: () => string | null
    readonly unrenewedMs: () => number
    readonly clockSkewMs: () => number | null
  },
  never,
  Scope.Scope
> =>
  Effect.gen(function* () {
    const times: LeaseTimes = {
      leaseDurationMs: options.leaseDurationMs ?? defaultLeaseTimes.leaseDurationMs,
      renewDeadlineMs: options.renewDeadlineMs ?? defaultLeaseTimes.renewDeadlineMs,
    }
    const bad = checkLeaseTimes(times)
    if (bad !== null) return yield* Effect.die(new Error(`lease: ${bad}`))
    const name = options.name ?? "reaper"
    const holder = options.holder ?? randomHolder()
    const timeout = Duration.millis(options.queryTimeoutMs ?? defaultQueryTimeoutMs)
    const clock = yield* Clock.Clock
    // The lease's own times (renewals, what was seen when, the deadline) on the monotonic clock:
    // a step of the wall clock (NTP, an operator) neither extends nor ends a leadership.
    const elapsedMs = () => Number(clock.monotonicTimeNanosUnsafe() / 1_000_000n)
    const advertise = options.advertise ?? (() => null)
    const adminTokenHash = options.adminTokenHash ?? (() => null)
    /** The holder's address and admin token fingerprint as last read (another replica's), or null. */
    let holderUrl: string | null = null
    let holderAdminTokenHash: string | null = null

    /** The epoch this replica holds the lease at (null: not held), and when it last renewed it. */
    let epoch: number | null = null
    let renewedAt = 0
    /** The row as last seen by a replica that does not hold it, and when it was first seen so. */
    let seen: Row | null = null
    let seenAt = 0
    /** The row as this replica's last renewal or takeover left it (while it holds the lease). */
    let confirmed: Row | null = null
    /** When this replica last saw the lease renewed or taken, by itself or another (`unrenewedMs`); first, when it began watching. */
    let changedAt = elapsedMs()

    /** Set by `giveUp`: this replica is stopping and takes no part any more. */
    let stopped = false
    /** Cleared by `stepDown` until `standAgain`: this replica watches the lease but takes it neither free nor over. */
    let standing = true

    /** The database's clock less this replica's, as the last lease query that read it showed (null: none yet). */
    let skewMs: number | null = null

    const isLeader = () => epoch !== null && elapsedMs() - renewedAt < times.renewDeadlineMs
    // Each query that answers the database's clock (`dbNow`) measures this replica's against it,
    // taken at the middle of the round trip.
    const query = (statement: ReturnType<typeof sql>) =>
      Effect.suspend(() => {
        const before = clock.currentTimeMillisUnsafe()
        return db.pool.query(statement).pipe(
          Effect.timeout(timeout),
          Effect.tap((rows) =>
            Effect.sync(() => {
              const dbNow = rows[0]?.["dbNow"]
              if (dbNow !== undefined && dbNow !== null) skewMs = Number(dbNow) - (before + clock.currentTimeMillisUnsafe()) / 2
            }),
          ),
        )
      })
    const confirm = (e: number, renewals: number, at: number) => {
      epoch = e
      renewedAt = at
      changedAt = at
      seen = null
      confirmed = { holder, epoch: e, renewals, durationMs: times.leaseDurationMs, url: null, adminTokenHash: null }
    }

    const readRow = query(sql`select holder, epoch, renewals, lease_duration_ms, url, admin_token_hash, ${dbNow} from leases where name = ${name}`).pipe(
      Effect.map((rows) => rowOf(rows[0])),
    )
    const renew = (held: number, renewals: number | null) =>
      query(sql`update leases set renewals = renewals + 1, lease_duration_ms = ${times.leaseDurationMs}, url = ${advertise()}, admin_token_hash = ${adminTokenHash()}
          where name = ${name} and holder = ${holder} and epoch = ${held} ${renewals === null ? sql`` : sql`and renewals = ${renewals}`} returning renewals, ${dbNow}`).pipe(
        Effect.map((rows) => (rows.length === 1 ? Number(rows[0]?.["renewals"]) : null)),
      )
    /** Past its renew deadline: a holder that cannot renew for sure gives the lease up (see the module's comment). */
    const pastDeadline = (now: number) => epoch !== null && now - renewedAt >= times.renewDeadlineMs

    const attempt = Effect.gen(function* () {
      if (stopped) return false
      const now = elapsedMs()
      /** The epoch this replica held until this attempt found it lost (null: none lost). */
      let lostEpoch: number | null = null
      /** The row as read by this attempt, if it read it already. */
      let read: Row | null | undefined = undefined
      if (epoch !== null && !pastDeadline(now)) {
        const renewals = yield* renew(epoch, null)
        if (renewals !== null) {
          confirm(epoch, renewals, now)
          return isLeader()
        }
        lostEpoch = epoch
        epoch = null
      } else if (epoch !== null) {
        // Past the deadline no blind renewal: read first, renew only the row as read.
        read = yield* readRow
        const ours = read !== null && read.holder === holder && read.epoch === epoch
        const renewals = ours ? yield* renew(epoch, read!.renewals) : null
        if (renewals !== null) {
          confirm(epoch, renewals, now)
          return isLeader()
        }
        if (ours) {
          // Still this replica's, but changed between the read and the renewal: a renewal it had
          // stopped waiting for landed. Given up, as in a failed check past the deadline.
          yield* Effect.logWarning("lease given up: its row changed under this replica's renewal (an earlier renewal it stopped waiting for landed); watching it like any other replica", {
            lease: name,
            replica: holder,
            epoch,
          })
          epoch = null
        } else {
          lostEpoch = epoch
          epoch = null
        }
      }
      const row =
        read !== undefined
          ? read
          : yield* readRow.pipe(
              // The renewal found the lease no longer this replica's, but who holds it is unknown.
              Effect.tapCause(() => (lostEpoch === null ? Effect.void : Effect.logWarning("lease lost: another replica holds it (its holder could not be read)", { lease: name, replica: holder, lostEpoch }))),
            )
      // Who holds it now, as the row reads after the failed renewal (not this replica's own holder id and old epoch).
      if (lostEpoch !== null)
        yield* Effect.logWarning("lease lost: another replica holds it", { lease: name, holder: row?.holder ?? null, epoch: row?.epoch ?? null, replica: holder, lostEpoch })
      if (row === null) {
        if (!standing) return false
        const inserted = yield* query(sql`insert into leases (name, holder, epoch, renewals, lease_duration_ms, url, admin_token_hash)
          values (${name}, ${holder}, 1, 0, ${times.leaseDurationMs}, ${advertise()}, ${adminTokenHash()}) on conflict (name) do nothing returning epoch, ${dbNow}`)
        if (inserted.length === 1) confirm(1, 0, now)
        return isLeader()
      }
      holderUrl = row.holder === holder ? null : row.url
      holderAdminTokenHash = row.holder === holder ? null : row.adminTokenHash
      if (seen === null || seen.holder !== row.holder || seen.epoch !== row.epoch || seen.renewals !== row.renewals || seen.durationMs !== row.durationMs) {
        // Seen changed as the read answered, not as this attempt began: the read may have waited
        // (up to the query timeout) and shown a renewal the holder sent after that beginning. The
        // holder acts for its renew deadline from its renewal's send, so a whole lease from the
        // answer (later than that send) is never inside it, whatever the query timeout.
        const answeredAt = elapsedMs()
        seen = row
        seenAt = answeredAt
        changedAt = answeredAt
      }
      // Alive while it changes; unchanged for the holder's whole lease: taken over, if still as seen.
      if (now - seenAt < row.durationMs || !standing) return false
      const taken = yield* query(sql`update leases set holder = ${holder}, epoch = epoch + 1, renewals = 0, lease_duration_ms = ${times.leaseDurationMs}, url = ${advertise()}, admin_token_hash = ${adminTokenHash()}
        where name = ${name} and epoch = ${row.epoch} and renewals = ${row.renewals} returning epoch, ${dbNow}`)
      if (taken.length === 1) {
        confirm(Number(taken[0]?.["epoch"]), 0, now)
        yield* Effect.logInfo("lease taken over", { lease: name, holder, epoch, from: row.holder })
      }
      return isLeader()
    })

    // One check at a time, and `giveUp` after the check in flight: a takeover it committed is
    // given up too (else the stopping replica would hold a whole lease it never renews).
    const serial = yield* Semaphore.make(1)
    const tick = serial.withPermits(1)(attempt.pipe(
      Effect.catchCause((cause) =>
        Effect.gen(function* () {
          yield* Effect.logWarning("lease check failed", { lease: name, holder, cause: String(cause) })
          // Not renewed: a holder goes on only until its renew deadline. Past it, a holder whose
          // query timed out gives the lease up: what it sent may still commit (a link slower than
          // the query timeout), so it sends no more. It waits for the lease as any other replica
          // does, from its last confirmed renewal (not from now: a whole extra lease without a
          // leader). A refused or broken connection sent nothing that can land later: the holder
          // keeps its epoch and, once the database answers, renews the row it reads as its own.
          const timedOut = cause.reasons.some((r) => Cause.isFailReason(r) && Cause.isTimeoutError(r.error))
          if (timedOut && pastDeadline(elapsedMs())) {
            yield* Effect.logWarning("lease given up: not renewed within its renew deadline and its last renewal may still land; watching it like any other replica", {
              lease: name,
              replica: holder,
              epoch,
              renewDeadlineMs: times.renewDeadlineMs,
            })
            epoch = null
            seen = confirmed
            seenAt = renewedAt
          }
          return isLeader()
        }),
      ),
    ))

    /** Gives the lease up for good: a lease of 0 ms, which the next replica to check takes over. */
    const giveUp = Effect.suspend(() => {
      stopped = true
      return serial.withPermits(1)(
        Effect.suspend(() => {
          const held = epoch
          epoch = null
          return held === null
            ? Effect.void
            : query(sql`update leases set lease_duration_ms = 0, renewals = renewals + 1 where name = ${name} and holder = ${holder} and epoch = ${held}`).pipe(Effect.ignore)
        }),
      )
    })
    yield* Effect.addFinalizer(() => giveUp)

    /** Gives the lease up as `giveUp` does, but only until `standAgain`: it watches meanwhile. */
    const stepDown = serial.withPermits(1)(
      Effect.suspend(() => {
        standing = false
        const held = epoch
        epoch = null
        return held === null
          ? Effect.void
          : query(sql`update leases set lease_duration_ms = 0, renewals = renewals + 1 where name = ${name} and holder = ${holder} and epoch = ${held}`).pipe(Effect.ignore)
      }),
    )

    return {
      holder,
      tick,
      isLeader,
      holds: () => epoch !== null,
      fence: (): Fence | null => (isLeader() && epoch !== null ? { name, epoch } : null),
      leaderUrl: () => (isLeader() ? advertise() : epoch === null ? holderUrl : null),
      leaderAdminTokenHash: () => (isLeader() ? adminTokenHash() : epoch === null ? holderAdminTokenHash : null),
      unrenewedMs: () => Math.max(0, elapsedMs() - changedAt),
      clockSkewMs: () => skewMs,
      giveUp,
      stepDown,
      standAgain: () => {
        standing = true
      },
    }
  })

/** The database's clock, epoch ms, as a lease query answers it. */
const dbNow = sql.raw(`(extract(epoch from clock_timestamp()) * 1000)::float8 as "dbNow"`)

/** A holder id when none is given. */
const randomHolder = (): string => `replica-${Math.random().toString(36).slice(2, 12)}`

/** The `application_name` prefix of a replica's lease connection (`engram-lease <holder>` in `pg_stat_activity`). */
export const applicationNamePrefix = "engram-lease "

/**
 * Leadership on the PostgreSQL at `url`, on a connection of its own: renewals do not queue
 * behind the store's pool. The store's start applies the migrations (the `leases` table). The
 * connection is named `engram-lease <holder>` (PostgreSQL keeps the first 63 bytes).
 */
export const layer = (options: LeaseOptions & { readonly url: string }): Layer.Layer<Leadership, Unavailable> =>
  Layer.effect(
    Leadership,
    Effect.gen(function* () {
      const holder = options.holder ?? randomHolder()
      const db = yield* PostgresJs.open({
        url: options.url,
        poolSize: 1,
        migrate: false,
        connectTimeoutSec: 5,
        statementTimeoutMs: options.queryTimeoutMs ?? defaultQueryTimeoutMs,
        applicationName: `${applicationNamePrefix}${holder}`,
      })
      return Leadership.of(yield* make(db, { ...options, holder }))
    }),
  )
