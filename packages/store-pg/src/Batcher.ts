/**
 * A group-commit batcher through Effect's request batching (`RequestResolver`): concurrent
 * callers' items are written by one statement. A batch goes at once when no statement is in
 * flight; while `maxInFlight` statements are out, new items wait and leave together with the
 * next free slot (up to `maxBatch` per statement). Items that may not share a statement (the
 * same host, the same session id) go in a statement after it. When a statement of several
 * items fails in a way one item alone can cause (`splitOn`, e.g. a unique violation), each
 * runs again alone, so one bad item never fails the others; a defect (an item the database
 * refuses) splits the statement too. Everything runs in fibers, so
 * interruption and tracing reach every statement.
 */
import { Unavailable } from "@engram/store"
import { Cause, Effect, Exit, Fiber, Request, RequestResolver, Semaphore } from "effect"
import type { NonEmptyArray } from "effect/Array"
import { retryAfterMs } from "./Db.js"
import { realDelay } from "./Transaction.js"

/** How a batcher groups and writes its items. */
export interface Options<I, A, E> {
  /** What it writes (e.g. `hostBeats`), as the timing hook names it (`timingHook`). */
  readonly name?: string | undefined
  /** At most this many items per statement (default 64). */
  readonly maxBatch?: number | undefined
  /** At most this many statements in flight (default 2). */
  readonly maxInFlight?: number | undefined
  /**
   * How long (real ms, fractions allowed) a batch keeps gathering items after its first one
   * arrived, before it waits for a free slot (default 0: what arrives in the same tick). The
   * wait yields to the event loop (`setImmediate`), so requests read from sockets meanwhile join.
   * A function is asked again for each batch.
   */
  readonly windowMs?: number | (() => number) | undefined
  /**
   * How long (real ms) a batch waits on a timer after its first item arrived, before it waits
   * for a free slot (default 0: none). For writes whose callers do not mind waiting (heartbeats,
   * reports): unlike `windowMs` the event loop sleeps meanwhile, so a long wait costs no CPU.
   */
  readonly timerMs?: number | undefined
  /** Keys no two items of one statement may share (e.g. the host written to, the session id). */
  readonly keysOf: (item: I) => readonly string[]
  /** Writes `items` in one statement; answers each item's answer, in order. */
  readonly run: (items: readonly I[]) => Effect.Effect<readonly A[], E>
  /** Whether a failure of a statement of several items may come from one item alone: each then runs alone. */
  readonly splitOn?: ((error: E) => boolean) | undefined
  /**
   * How long (real ms) a statement may hold its slot (default 60,000). Past it, its items are
   * answered `Unavailable`, the slot is free for the next group, and the statement is
   * interrupted in the background. A statement's callers leaving does not end it, so without
   * this one that never answers (a driver waiting on a connection that will not) would hold
   * the slot, and every later item would wait behind it, for ever.
   */
  readonly holdBoundMs?: number | undefined
}

/** One statement's timing, as a batcher gives it to `timingHook`. */
export interface StatementTiming {
  /** The batcher's `name`. */
  readonly name: string
  /** Its items. */
  readonly items: number
  /** From its first item's arrival to the statement's start (real ms): the gathering window plus any wait for a free slot. */
  readonly waitedMs: number
  /** The statement's own time (real ms), until it answered or gave its slot back. */
  readonly statementMs: number
}

/**
 * A diagnostic hook: when a function is installed at this global symbol before a batcher is
 * made, that batcher gives it each statement's timing (the fleet bench's `stages.ts` installs
 * one in the coordinator's process). Without one, items carry no timestamps and nothing is
 * measured.
 */
export const timingHook = Symbol.for("engram.batcher.timing")

/**
 * Waits `ms` of real time (not the Clock: tests run on a TestClock), turn by turn of the event
 * loop (`setImmediate`), so that I/O arriving meanwhile is handled and its items join the batch.
 */
const gather = (ms: number): Effect.Effect<void> =>
  Effect.callback<void>((resume) => {
    const until = performance.now() + ms
    let handle: NodeJS.Immediate
    const turn = () => {
      if (performance.now() >= until) resume(Effect.void)
      else handle = setImmediate(turn)
    }
    handle = setImmediate(turn)
    return Effect.sync(() => clearImmediate(handle))
  })

/** Builds a batcher: a function that writes one item, together with whatever items are waiting. */
export const make = <I, A, E>(options: Options<I, A, E>): ((item: I) => Effect.Effect<A, E | Unavailable>) => {
  type E2 = E | Unavailable
  interface Item extends Request.Request<A, E2> {
    readonly item: I
    /** When it arrived (`performance.now()`), with a timing hook installed; else 0. */
    readonly at: number
  }
  const Item = Request.of<Item>()
  const maxBatch = options.maxBatch ?? 64
  const slots = Semaphore.makeUnsafe(options.maxInFlight ?? 2)
  const splitOn = options.splitOn ?? (() => false)

  const holdBoundMs = options.holdBoundMs ?? 60_000

  const complete = (entries: readonly Request.Entry<Item>[], exit: Exit.Exit<readonly A[], E2>) =>
    Effect.sync(() =>
      entries.forEach((e, i) =>
        e.completeUnsafe(Exit.isSuccess(exit) ? Exit.succeed(exit.value[i] as A) : (exit as Exit.Exit<never, E2>)),
      ),
    )

  /** One statement, or `Unavailable` once it held its slot `holdBoundMs` (then interrupted in the background). */
  const bounded = (items: readonly I[]): Effect.Effect<readonly A[], E2> =>
    Effect.gen(function* () {
      const statement = yield* Effect.forkDetach(options.run(items))
      const timedOut = realDelay(holdBoundMs).pipe(
        Effect.andThen(
          Effect.fail(new Unavailable({ reason: `a grouped write did not finish within ${holdBoundMs} ms; its slot is given back and its outcome is unknown until read back`, retryAfterMs })),
        ),
      )
      return yield* Effect.raceFirst(Fiber.join(statement), timedOut).pipe(Effect.onExit(() => Effect.asVoid(Effect.forkDetach(Fiber.interrupt(statement)))))
    })

  const hook = (globalThis as Record<symbol, unknown>)[timingHook] as ((t: StatementTiming) => void) | undefined
  const name = options.name ?? "batch"
  /** One statement, its timing given to the hook when one is installed. */
  const timed = (entries: readonly Request.Entry<Item>[]): Effect.Effect<readonly A[], E2> => {
    if (hook === undefined) return bounded(entries.map((e) => e.request.item))
    return Effect.suspend(() => {
      const start = performance.now()
      const first = entries.reduce((min, e) => Math.min(min, e.request.at), start)
      return bounded(entries.map((e) => e.request.item)).pipe(
        // A diagnostic hook that throws must not turn rows that were written into a failure.
        Effect.onExit(() =>
          Effect.sync(() => {
            try {
              hook({ name, items: entries.length, waitedMs: start - first, statementMs: performance.now() - start })
            } catch {
              // the hook's own failure is the hook's
            }
          }),
        ),
      )
    })
  }
  const runStatement = (entries: readonly Request.Entry<Item>[]): Effect.Effect<void> =>
    Effect.exit(timed(entries)).pipe(
      Effect.flatMap((exit) => {
        if (
          Exit.isFailure(exit) &&
          entries.length > 1 &&
          exit.cause.reasons.some((r) => (Cause.isFailReason(r) && splitOn(r.error as E)) || Cause.isDieReason(r))
        )
          // One item may have failed them all (a typed failure `splitOn` names, or a defect such
          // as a value the database refuses): each again, alone, so only that item fails.
          return Effect.forEach(entries, (e) => runStatement([e]), { discard: true })
        return complete(entries, exit)
      }),
    )

  // Items that share a key go in a later statement of the same batch.
  const statementsOf = (entries: NonEmptyArray<Request.Entry<Item>>): Request.Entry<Item>[][] => {
    const out: { readonly entries: Request.Entry<Item>[]; readonly keys: Set<string> }[] = []
    for (const e of entries) {
      const keys = options.keysOf(e.request.item)
      let target = out.find((s) => keys.every((k) => !s.keys.has(k)))
      if (target === undefined) {
        target = { entries: [], keys: new Set() }
        out.push(target)
      }
      target.entries.push(e)
      for (const k of keys) target.keys.add(k)
    }
    return out.map((s) => s.entries)
  }

  const windowMs = options.windowMs ?? 0
  const timerMs = options.timerMs ?? 0
  const gathering =
    timerMs > 0
      ? realDelay(timerMs)
      : typeof windowMs === "function"
        ? Effect.suspend(() => {
            const ms = windowMs()
            return ms > 0 ? gather(ms) : Effect.yieldNow
          })
        : windowMs > 0
          ? gather(windowMs)
          : Effect.yieldNow
  const resolver = RequestResolver.makeWith<Item>({
    batchKey: () => "batch",
    // Gather what arrives in this tick (or within the window), then wait for a free slot:
    // items keep joining meanwhile.
    delay: Effect.andThen(gathering, slots.withPermits(1)(Effect.void)),
    collectWhile: (entries) => entries.size < maxBatch,
    runAll: (entries) => slots.withPermits(1)(Effect.forEach(statementsOf(entries), runStatement, { discard: true })),
  })

  return hook === undefined
    ? (item) => Effect.request(Item({ item, at: 0 }), resolver)
    : (item) => Effect.suspend(() => Effect.request(Item({ item, at: performance.now() }), resolver))
}
