/**
 * Every store call answers within a bound. The store is wrapped so that a call the database
 * has not answered after `timeoutMs` (real time) is interrupted and fails `Unavailable`, which
 * the API answers `503` with `Retry-After`: a request never hangs on a database that is away or
 * a link to it that went silent. Timing out never reports success, and the caller is told that
 * a write's outcome is unknown until read back (on PostgreSQL the server's own
 * `statement_timeout`, set to the same bound, rolls such a write back), or that a read changed
 * nothing.
 *
 * A call that timed out either way (our bound, or the server's `statement_timeout`) fails with
 * one wording, and `Stalls` is told: it warns what the database waits on (a lock, and whose).
 *
 * It also keeps what readiness needs beyond a read: after a write failed for a full disk, or on a
 * database that only reads, the store is not ready (`StoreHealth.writesRefused`) until a write
 * succeeds again.
 */
import { readOperations, Unavailable } from "@engram/store"
import type { StoreShape } from "@engram/store"
import { Clock, Context, Effect, Option } from "effect"
import { HttpServerRequest } from "effect/http"
import * as Stalls from "./Stalls.js"
import type { StallsShape } from "./Stalls.js"
import * as Tracing from "./Tracing.js"

/** A store call a request was waiting on when the request was interrupted (its client left, the server stops). */
export interface CutStoreCall {
  readonly operation: string
  /** How long the call had waited, ms. */
  readonly waitedMs: number
}

/** The store call each interrupted request was waiting on (its first), read by the edge when it answers the request. */
export const cutStoreCalls = new WeakMap<HttpServerRequest.HttpServerRequest, CutStoreCall>()

/** How long a caller should wait before retrying after a store call timed out. */
export const retryAfterMs = 1000

/**
 * A store call past its bound: ours, or the server's `statement_timeout` (57014, set to the same
 * bound), which race; one cause, so one wording. It says what the caller may assume: a read
 * (`readOperations`) changed nothing; a write's outcome is unknown until read back.
 */
export const timedOut = (ms: number, name: string) =>
  new Unavailable({
    reason: `the database did not answer ${name} within ${ms} ms (ENGRAM_STORE_TIMEOUT_MS); ${readOperations.has(name) ? "a read: nothing was changed" : "a write's outcome is unknown until read back"}`,
    retryAfterMs,
    kind: "timed_out",
  })

/**
 * Bounds one effect: its own answer, or `Unavailable` after `ms`. The effect runs in a fiber of
 * its own that is interrupted in the background once the answer is given: a call stuck where
 * interruption must wait (a transaction's rollback on a connection that went silent) cannot hold
 * the answer past the bound. The bound is real time, not the Effect Clock: tests drive the
 * reaper on a TestClock, where a bound on the Effect Clock would fire when the test moves time,
 * not when the database is slow. Every request that reads the store passes here, so it costs one
 * fiber and, unless the call answers at once, one timer and one observer (no race of fibers).
 * A caller interrupted at any point, even before its call's first step ended, interrupts the call.
 */
export const bounded = <A, E, R>(
  effect: Effect.Effect<A, E, R>,
  ms: number,
  name: string,
  /** The failure past the bound (default: a store call's, naming `ENGRAM_STORE_TIMEOUT_MS`). */
  timeout: (ms: number, name: string) => Unavailable = timedOut,
  /** Told once if the call has not answered after `afterMs` (below `ms`): what it waits on is read while it still waits. */
  slow?: { readonly afterMs: number; readonly notice: () => void },
): Effect.Effect<A, E | Unavailable, R> =>
  // Uninterruptible from the fork until the wait: a caller interrupted in between (the call's
  // first step runs before the fork returns) would leave the call running on, unbounded. The
  // call's fiber is interruptible all the same (a fork does not inherit the mask).
  Effect.uninterruptibleMask((restore) =>
    Effect.flatMap(Effect.forkDetach(effect, { startImmediately: true }), (call) => {
      const answered = call.pollUnsafe()
      if (answered !== undefined) return answered
      const wait = Effect.callback<A, E | Unavailable>((resume) => {
        const fire = () => {
          stopObserving()
          resume(Effect.fail(timeout(ms, name)))
          call.interruptUnsafe()
        }
        // One timer at a time: to the slow notice if any, then on to the bound.
        let timer =
          slow === undefined
            ? setTimeout(fire, ms)
            : setTimeout(() => {
                timer = setTimeout(fire, ms - slow.afterMs)
                slow.notice()
              }, slow.afterMs)
        const stopObserving = call.addObserver((exit) => {
          clearTimeout(timer)
          resume(exit)
        })
        return Effect.sync(() => {
          clearTimeout(timer)
          stopObserving()
        })
      })
      // The caller was interrupted (its client left, the server stops), while waiting or before
      // it began (`restore` answers a pending interruption at once): so is the call, in the background.
      // A request's call is noted for the edge, which logs and counts a request its client left.
      const startedAt = Date.now()
      return Effect.onInterrupt(restore(wait), () =>
        Effect.withFiber((fiber) => {
          call.interruptUnsafe()
          const request = Context.getOption(fiber.context, HttpServerRequest.HttpServerRequest)
          if (Option.isSome(request) && !cutStoreCalls.has(request.value)) cutStoreCalls.set(request.value, { operation: name, waitedMs: Date.now() - startedAt })
          return Effect.void
        }),
      )
    }),
  )

/**
 * The failure of a probe's store read past its own bound (`ENGRAM_PROBE_TIMEOUT_MS`): a
 * readiness probe or a scrape times out long before a store call's bound.
 */
export const probeTimedOut = (ms: number, check: string) =>
  new Unavailable({
    reason: `the store did not answer ${check} within ${ms} ms (ENGRAM_PROBE_TIMEOUT_MS)`,
    retryAfterMs,
  })

/** Why the store refuses writes: its disk is full, or the database only reads; the last refusal's words, and when (epoch ms). */
export interface WritesRefused {
  readonly kind: "disk_full" | "read_only"
  readonly message: string
  readonly atMs: number
}

/**
 * How long a refusal by a database that only reads keeps the store not ready without another
 * (ms). A replica not ready gets no traffic (its load balancer, and agents and clients move away
 * on `ReadOnly`), so no write would come to clear it: it is ready again after this, and the next
 * write refused makes it not ready again. A full disk keeps it until a write succeeds (agents
 * stay on `DiskFull`: their writes come).
 */
export const readOnlyHoldMs = 10_000

/** What the store's calls showed beyond their own answers. */
export interface StoreHealthShape {
  /**
   * Why writes fail at `nowMs` (the last such failure: a full disk until a write succeeds, a
   * database that only reads for `readOnlyHoldMs`), or null.
   */
  readonly writesRefused: (nowMs: number) => WritesRefused | null
}

/** The store's health as its calls showed it (readiness). */
export class StoreHealth extends Context.Service<StoreHealth, StoreHealthShape>()("@engram/coordinator/StoreHealth") {}

/**
 * The store with every call that answers an effect bounded by `timeoutMs`, and its health:
 * a write refused for a full disk marks it, a write that succeeds clears it. With tracing on
 * (`span`), each call is a span `engram.store.<operation>`.
 */
export const boundStore = (
  store: StoreShape,
  timeoutMs: number,
  span: Tracing.Span = Tracing.none,
  /** Told of every call that timed out (it reads and warns what the database waits on). */
  stalls: StallsShape = Stalls.none,
): { readonly store: StoreShape; readonly health: StoreHealthShape } => {
  let refused: WritesRefused | null = null
  // A call that waited most of its bound: what the database waits on is read now, while the call
  // still waits (the server's `statement_timeout`, the same bound, cancels it when it times out).
  const slow = stalls === Stalls.none ? undefined : { afterMs: Stalls.readBeforeMs(timeoutMs), notice: () => stalls.slow(Stalls.readBeforeMs(timeoutMs)) }
  const out: Record<string, unknown> = {}
  for (const [name, value] of Object.entries(store)) {
    out[name] =
      typeof value === "function"
        ? (...args: unknown[]) => {
            const result: unknown = (value as (...a: unknown[]) => unknown).apply(store, args)
            if (!Effect.isEffect(result)) return result
            const call = bounded(result, timeoutMs, name, timedOut, slow).pipe(
              Effect.catch((e: unknown) =>
                e instanceof Unavailable && e.kind === "timed_out"
                  ? Effect.andThen(stalls.timedOut(name), Effect.fail(timedOut(timeoutMs, name)))
                  : Effect.fail(e),
              ),
              span(`engram.store.${name}`),
            )
            return readOperations.has(name)
              ? call
              : call.pipe(
                  Effect.tap(() =>
                    Effect.sync(() => {
                      refused = null
                    }),
                  ),
                  Effect.tapError((e: unknown) =>
                    e instanceof Unavailable && (e.kind === "disk_full" || e.kind === "read_only")
                      ? Effect.map(Clock.currentTimeMillis, (atMs) => {
                          refused = { kind: e.kind as WritesRefused["kind"], message: e.message, atMs }
                        })
                      : Effect.void,
                  ),
                )
          }
        : value
  }
  return {
    store: out as unknown as StoreShape,
    health: { writesRefused: (nowMs) => (refused !== null && refused.kind === "read_only" && nowMs - refused.atMs >= readOnlyHoldMs ? null : refused) },
  }
}
