/**
 * The one registry of this process's waiters, keyed by topic: an agent's long-poll waits on
 * its host (`host:<id>`), a wait for a session's state on the session and its host, a move
 * request on its move and its hosts, a long-poll of a host token on its credential. Handlers
 * and the reaper notify after they change something; the notice goes through `@engram/store`'s
 * `Changes` (in this process at once; on PostgreSQL also to every other replica, by
 * LISTEN/NOTIFY), and the registry wakes the waiters of its topics. Nothing here reads the
 * store: a waiter re-reads only when its topics changed, or when the backend says notices may
 * have been missed (then every waiter is woken once).
 *
 * A watch is level-triggered: a change that arrives while its waiter is busy re-reading is kept
 * and answers the waiter's next `next` at once, so no change between two waits is lost.
 */
import { Changes, Topic } from "@engram/store"
import { Clock, Context, Duration, Effect, Layer } from "effect"
import type { Option, Scope } from "effect"
import { addTo, removeFrom } from "./SetsByKey.js"

/**
 * Why a watch's `next` answered. `ended`: the long-poll it belongs to was ended from outside
 * (its credential revoked, `WaitEnd`): the wait answers now, and the caller decides the answer.
 */
export type Woken = "changed" | "missed" | "timeout" | "ended"

/** A watch on some topics, open until its scope closes. */
export interface Watch {
  /**
   * Waits until one of the watch's topics changed since the watch opened or since the last
   * `next` answered, or notices may have been missed, or the wait was ended (`WaitEnd`), or
   * `timeoutMs` passes (Effect Clock; by the deadline wheel's pass, up to `earlyMs(timeoutMs)`
   * before, or at the deadline itself with `exact`: a wait whose deadline acts, as a move's).
   */
  readonly next: (timeoutMs: number, options?: { readonly exact?: boolean }) => Effect.Effect<Woken>
}

/** Who a parked wait (`OpenWatch.park`) tells when it answers: called once, with why. */
export interface Parker {
  readonly woken: (why: Woken) => void
}

/**
 * A watch opened without a scope or a fiber (`NotifierShape.open`), closed by its owner: what a
 * long-poll that parks no fiber while it waits holds (`ParkedPoll`).
 */
export interface OpenWatch extends Watch {
  /**
   * As `next`, without a fiber: answers at once (the reason) when `next` would, else arms the
   * wait from `now` (Effect Clock's, read by the caller) and answers null; `parker` is then told
   * once, when the wait answers (not when the watch is closed first).
   */
  readonly park: (now: number, timeoutMs: number, parker: Parker) => Woken | null
  readonly close: () => void
}

/**
 * A handler's write and the notices it owes, as one step its client's leaving does not cut (an
 * uninterruptible region; every store call in it keeps its own bound, `StoreBound`, and a
 * forwarded create its forward's). Cut between the store's commit and `notify`, the write would
 * stand unheard: a write whose call was cut may still commit (a grouped create commits in the
 * batch's own fiber; a statement sent is not taken back), and then another replica's cached
 * assignments would never list a session placed here (its agent, polling there, would not start
 * it), a rotated token's open long-polls there would stay open, a waiter would wait out its
 * deadline. Seen with a replica frozen (SIGSTOP) while a client's create was in flight: the
 * client gave up, the replica, resumed, placed the session and never told the replica its host
 * polled. The answer to a client that left is dropped as before. Reads before the write (the
 * session's, the move's) and a drain's wait after the notice stay interruptible
 * (`Effect.interruptible` where they are), so shutdown is held only by writes.
 */
export const withNotices = <A, E, R>(write: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> => Effect.uninterruptible(write)

/** The topics a create's or cold resume's outcome changed: its host's (placed) or the queue's, and the session's. */
export const placedTopics = (o: { readonly _tag: "Placed" | "Queued"; readonly session: { readonly id: string; readonly hostId: string | null } }): readonly (string | null)[] => [
  o._tag === "Placed" ? hostTopic(o.session.hostId) : queueTopic,
  sessionTopic(o.session.id),
]

/**
 * The topics a session's end changed, however it ended (the API's `DELETE`, its TTL in a reaper
 * pass), from the store's answer to the end (`EndResult`: the session as the end found it and the
 * move it closed, never a read before the end, which a move begun meanwhile would escape): its
 * host's (the room is free), the session's, the host holding its descent image (no longer that
 * host's to keep: its agent deletes it), and the move the end aborted: the move's waiters and its
 * target's agent (the target's reservation is released).
 */
export const endedTopics = (
  before: { readonly id: string; readonly hostId: string | null; readonly imageHostId: string | null },
  open: { readonly id: string; readonly targetHostId: string } | null,
): readonly (string | null)[] => [
  hostTopic(before.hostId),
  sessionTopic(before.id),
  hostTopic(before.imageHostId),
  open === null ? null : hostTopic(open.targetHostId),
  open === null ? null : moveTopic(open.id),
]

export interface NotifierShape {
  /** Announces that these topics changed: wakes their waiters here and on every replica. */
  readonly notify: (...topics: readonly (string | null | undefined)[]) => Effect.Effect<void>
  /** Opens a watch on `topics` (ended with `end`, when given) until its owner closes it. */
  readonly open: (topics: readonly string[], end: WaitEndHandle | null) => OpenWatch
  /** Opens a watch on `topics` until the scope closes. */
  readonly watch: (topics: readonly string[]) => Effect.Effect<Watch, never, Scope.Scope>
  /**
   * Runs `use` with a watch on `topics`, open until `use` ends: as `watch`, without a scope (what
   * the long-polls use: closing it copies no context).
   */
  readonly withWatch: <A, E, R>(topics: readonly string[], use: (watch: Watch) => Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>
  /** Waits once on `topics` up to `timeoutMs`; answers whether one of them changed (or notices were missed). */
  readonly wait: (topics: readonly string[], timeoutMs: number) => Effect.Effect<boolean>
  /** How many watches are open now. */
  readonly watching: () => number
  /** How many waits the deadline wheel holds now (each `next` in progress). */
  readonly timed: () => number
  /** How many passes of the deadline wheel have answered waits so far (each answers every wait then due). */
  readonly passes: () => number
}

/**
 * The handle that ends one long-poll's waits from outside (`LongPolls`: its credential was
 * revoked): every watch opened with it in context answers `ended` now and at every later `next`.
 */
export class WaitEnd extends Context.Service<WaitEnd, WaitEndHandle>()("@engram/coordinator/WaitEnd") {}

export interface WaitEndHandle {
  ended: boolean
  /** The watches open under it: each ends its wait. */
  readonly watches: Set<{ readonly endWait: () => void }>
}

/** A handle for `WaitEnd`, not ended. */
export const makeWaitEnd = (): WaitEndHandle => ({ ended: false, watches: new Set() })

/** Ends the waits under `handle`: now, and every later one. */
export const endWaits = (handle: WaitEndHandle): void => {
  if (handle.ended) return
  handle.ended = true
  for (const w of handle.watches) w.endWait()
}

/** The most a timed-out wait answers before its deadline. */
export const maxEarlyMs = 1000

/**
 * How early the deadline wheel may answer a wait of `timeoutMs`: a twentieth of it, at most
 * `maxEarlyMs` (a 20 s long-poll answers at 19.00–19.05 s). A busy event loop runs timers late,
 * never early: answering a little early keeps a poll inside its bound under load.
 */
export const earlyMs = (timeoutMs: number): number => Math.min(maxEarlyMs, Math.floor(timeoutMs / 20))

/** The wheel's resolution: deadlines in one slot of this many ms are answered in one pass. */
export const slotMs = 50

/** What a `next` answers, one of each (an Effect is a description: shared by every wait). */
const answers: Readonly<Record<Woken, Effect.Effect<Woken>>> = {
  changed: Effect.succeed("changed"),
  missed: Effect.succeed("missed"),
  timeout: Effect.succeed("timeout"),
  ended: Effect.succeed("ended"),
}

/** The registry's part a watch calls into (one per registry). */
interface Registry {
  readonly enslot: (e: Entry, slot: number) => void
  readonly unslot: (e: Entry) => void
  readonly answer: (e: Entry, why: Woken) => boolean
  readonly close: (e: Entry) => void
}

/**
 * One open watch. A class, its methods on the prototype: an agent's long-poll holds its watch for
 * up to 30 s, and at 10,000 agents every object a poll holds is copied by the young generation's
 * collector (once within it, once into the old): no closures of its own per watch and per wait.
 */
class Entry implements OpenWatch {
  /** What happened since the last `next` answered: nothing, a possible miss, a change. */
  pending: Woken | null = null
  /** The wait in progress (a `next` suspended): its fiber's resume, called once. */
  resume: ((answer: Effect.Effect<Woken>) => void) | null = null
  /** The parked wait in progress (`park`), told once; never set with `resume`. */
  parker: Parker | null = null
  /** The wheel's slot of the wait in progress, or null. */
  slot: number | null = null
  /** The timeout of the `next` being set up, and whether its deadline is exact (read by `begin`). */
  private timeoutMs = 0
  private exact = false
  constructor(
    readonly registry: Registry,
    readonly topics: readonly string[],
    readonly end: WaitEndHandle | null,
  ) {}
  /** The wait ended from outside (`WaitEnd`). */
  endWait(): void {
    this.registry.answer(this, "ended")
  }
  close(): void {
    this.registry.close(this)
  }
  /**
   * What a wait of `timeoutMs` answers at once, `next`'s and `park`'s alike: the watch ended, what
   * happened since the last answer (taken), or no time left; null: it waits.
   */
  private atOnce(timeoutMs: number): Woken | null {
    if (this.end?.ended === true) return "ended"
    const already = this.pending
    this.pending = null
    if (already !== null) return already
    return timeoutMs > 0 ? null : "timeout"
  }
  /** The wheel's slot of a wait of `t` from `now`: its deadline, or (not `exact`) the slot a little before it. */
  private slotOf(now: number, t: number, exact: boolean): number {
    return exact ? now + t : Math.ceil((now + t - earlyMs(t)) / slotMs) * slotMs
  }
  park(now: number, timeoutMs: number, parker: Parker): Woken | null {
    const why = this.atOnce(timeoutMs)
    if (why !== null) return why
    this.parker = parker
    this.registry.enslot(this, this.slotOf(now, timeoutMs, false))
    return null
  }
  next(timeoutMs: number, options?: { readonly exact?: boolean }): Effect.Effect<Woken> {
    return Effect.suspend(() => {
      const why = this.atOnce(timeoutMs)
      if (why !== null) return answers[why]
      this.timeoutMs = timeoutMs
      this.exact = options?.exact === true
      return Effect.flatMap(Clock.currentTimeMillis, this.begin)
    })
  }
  /** Suspends the wait until `answer` resumes it (or its deadline's slot passes). */
  private readonly begin = (now: number): Effect.Effect<Woken> =>
    Effect.callback<Woken>((resume) => {
      this.resume = resume
      const t = this.timeoutMs
      this.registry.enslot(this, this.slotOf(now, t, this.exact))
      // Interrupted (the request went away): out of the wheel at once.
      return this.interrupted
    })
  private readonly interrupted = Effect.sync(() => {
    this.resume = null
    this.registry.unslot(this)
  })
}

const topicsOf = (topics: readonly (string | null | undefined)[]): string[] => topics.filter((t): t is string => t !== null && t !== undefined && t !== "")

/** The registry over `changes`: subscribes for as long as `scope` lives. */
const make = Effect.gen(function* () {
  const changes = yield* Changes
  const byTopic = new Map<string, Set<Entry>>()
  const all = new Set<Entry>()

  // ---- the deadline wheel: every wait's deadline in one map of slots, one fiber and one timer
  // for all of them (no fiber, timer or sleep per wait). The fiber sleeps (Effect Clock) until
  // the earliest slot, then answers every wait of every slot that is due, in one pass; a wait
  // that is answered otherwise leaves its slot.
  const slots = new Map<number, Set<Entry>>()
  let timed = 0
  let passes = 0
  /** The slot the wheel's fiber sleeps until (Infinity: until a wait arrives). */
  let armedAt = Number.POSITIVE_INFINITY
  /** Wakes the wheel's fiber to re-arm earlier (set while it sleeps). */
  let rearm: (() => void) | null = null
  const unslot = (e: Entry) => {
    if (e.slot === null) return
    removeFrom(slots, e.slot, e)
    e.slot = null
    timed--
  }
  const enslot = (e: Entry, slot: number) => {
    e.slot = slot
    addTo(slots, slot, e)
    timed++
    if (slot < armedAt) {
      armedAt = slot
      const r = rearm
      rearm = null
      r?.()
    }
  }
  /** Answers the wait in progress on `e` (if any) with `why`. */
  const answer = (e: Entry, why: Woken): boolean => {
    const r = e.resume
    const parker = e.parker
    if (r === null && parker === null) return false
    e.resume = null
    e.parker = null
    unslot(e)
    if (r !== null) r(answers[why])
    else parker?.woken(why)
    return true
  }
  const sleepUntilRearmed = Effect.callback<void>((resume) => {
    rearm = () => resume(Effect.void)
    return Effect.sync(() => {
      rearm = null
    })
  })
  const turn = Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    let earliest = Number.POSITIVE_INFINITY
    const due: Entry[] = []
    // One pass over the slots (a few hundred at most: deadlines within minutes, 50 ms apart).
    for (const [slot, entries] of slots) {
      if (slot > now) {
        if (slot < earliest) earliest = slot
        continue
      }
      for (const e of entries) due.push(e)
      slots.delete(slot)
    }
    armedAt = earliest
    for (const e of due) {
      e.slot = null
      timed--
    }
    // Every due wait answered in this pass (their fibers run as they are resumed).
    if (due.length > 0) passes++
    for (const e of due) answer(e, "timeout")
    if (armedAt === Number.POSITIVE_INFINITY) yield* sleepUntilRearmed
    else yield* Effect.timeoutOption(sleepUntilRearmed, Duration.millis(armedAt - now))
  })
  yield* Effect.forkScoped(Effect.forever(turn))

  const fire = (e: Entry, why: "changed" | "missed") => {
    if (answer(e, why)) return
    if (e.pending !== "changed") e.pending = why
  }
  // Woken after every subscriber heard the notice (a microtask later): a woken fiber may run at
  // once, and must find the copies in memory the notice drops (assignments, credentials) gone.
  const changedLater = new Set<Entry>()
  let missedLater = false
  let scheduled = false
  const later = () => {
    if (scheduled) return
    scheduled = true
    queueMicrotask(() => {
      scheduled = false
      const changed = [...changedLater]
      changedLater.clear()
      const missed = missedLater
      missedLater = false
      for (const e of changed) fire(e, "changed")
      if (missed) for (const e of [...all]) fire(e, "missed")
    })
  }
  yield* changes.subscribe({
    changed: (topics) => {
      for (const t of [...topics, anyTopic]) {
        const set = byTopic.get(t)
        if (set === undefined) continue
        for (const e of set) changedLater.add(e)
        later()
      }
    },
    missed: () => {
      missedLater = true
      later()
    },
  })

  const registry: Registry = {
    enslot,
    unslot,
    answer,
    close: (e) => {
      all.delete(e)
      changedLater.delete(e)
      for (const t of e.topics) removeFrom(byTopic, t, e)
      e.end?.watches.delete(e)
      e.resume = null
      e.parker = null
      unslot(e)
    },
  }
  /** Opens a watch on `topics` (ended with `end`, when given); `close` closes it. */
  const open = (topics: readonly string[], end: WaitEndHandle | null): Entry => {
    const e = new Entry(registry, topics, end)
    all.add(e)
    for (const t of topics) addTo(byTopic, t, e)
    end?.watches.add(e)
    return e
  }
  const endOf = (handle: Option.Option<WaitEndHandle>): WaitEndHandle | null => (handle._tag === "Some" ? handle.value : null)
  const watch: NotifierShape["watch"] = (topics) =>
    Effect.flatMap(Effect.serviceOption(WaitEnd), (handle) =>
      Effect.map(
        Effect.acquireRelease(
          Effect.sync(() => open(topics, endOf(handle))),
          (w) => Effect.sync(() => w.close()),
        ),
        (w): Watch => w,
      ),
    )
  // Without a scope: a scope's finalizer runs in the context its resource was acquired in, which
  // costs a copy of the request's whole context (every service) when the wait ends.
  const withWatch: NotifierShape["withWatch"] = (topics, use) =>
    Effect.flatMap(Effect.serviceOption(WaitEnd), (handle) =>
      Effect.acquireUseRelease(
        Effect.sync(() => open(topics, endOf(handle))),
        use,
        (w) => Effect.sync(() => w.close()),
      ),
    )

  return Notifier.of({
    notify: (...topics) => changes.publish(topicsOf(topics)),
    open,
    watch,
    withWatch,
    wait: (topics, timeoutMs) => withWatch(topics, (w) => Effect.map(w.next(timeoutMs), (why) => why === "changed" || why === "missed")),
    watching: () => all.size,
    timed: () => timed,
    passes: () => passes,
  })
})

export class Notifier extends Context.Service<Notifier, NotifierShape>()("@engram/coordinator/Notifier") {
  /** The registry over the `Changes` of the store the coordinator runs on. */
  static readonly layer: Layer.Layer<Notifier, never, Changes> = Layer.effect(Notifier, make)
}

/** The topic a watch names to hear every change (the dashboard's long-poll). */
export const anyTopic = "*"

/** Topic of the queue: a session was queued. */
export const queueTopic = Topic.queue

/** Topic of the fleet's room as a whole: a host's report, an external reservation. */
export const fleetTopic = Topic.fleet

/** Topic of a host's assignments. */
export const hostTopic = (hostId: string | null | undefined): string | null => (hostId ? Topic.host(hostId) : null)
/** Topic of a move's outcome. */
export const moveTopic = (moveId: string): string => Topic.move(moveId)
/** Topic of a session's state (its waiters, `GET /v1/sessions/{id}/wait`). */
export const sessionTopic = (sessionId: string | null | undefined): string | null => (sessionId ? Topic.session(sessionId) : null)
/** Topic of a host's credential (rotated, or the host removed): its open long-polls end with 401. */
export const credentialTopic = (hostId: string): string => Topic.credential(hostId)
