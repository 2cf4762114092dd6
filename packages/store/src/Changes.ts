/**
 * Change notices: which records changed, so that whoever waits on them (an agent's long-poll of
 * its assignments, a wait for a session's state, a move's outcome) or keeps a copy of them (a
 * cache of a host's assignments, of a credential) learns it from the change itself instead of
 * re-reading the store. A topic names what changed (`Topic`): a host's assignments, a session, a
 * move, a host's credential.
 *
 * The writer publishes after its write; every subscriber of every process that shares the store
 * hears it. One process (an embedded store, a store in memory) needs nothing more than
 * `Changes.local`; processes that share a database need the backend's own (store-pg's
 * `ChangesPg`: PostgreSQL `LISTEN/NOTIFY`). Where notices may have been lost (a listening
 * connection dropped, another process left without saying what it had changed) the backend says
 * so (`missed`), and every subscriber treats everything as changed.
 */
import { Context, Effect, Layer } from "effect"
import type { Scope } from "effect"

/** What a subscriber is told. Both are called synchronously and must neither throw nor block. */
export interface Listener {
  /** These topics changed (through this process or another). */
  readonly changed: (topics: readonly string[]) => void
  /** Notices may have been lost: anything may have changed. */
  readonly missed: () => void
}

export interface ChangesShape {
  /**
   * Announces that `topics` changed: to this process's subscribers at once, and to every other
   * process sharing the store as soon as the backend can. Never fails and never waits on I/O.
   */
  readonly publish: (topics: Iterable<string>) => Effect.Effect<void>
  /** Subscribes `listener` until the scope closes. */
  readonly subscribe: (listener: Listener) => Effect.Effect<void, never, Scope.Scope>
  /**
   * True while every change made through any process is known to reach this one's subscribers
   * (always, for one process). A copy kept in memory may answer for the store only while it holds.
   */
  readonly live: () => boolean
}

/** The topics of change notices. */
export const Topic = {
  /** A host's assignments: its sessions with work for its agent and its pending moves. */
  host: (hostId: string): string => `host:${hostId}`,
  /** A session's record. */
  session: (sessionId: string): string => `session:${sessionId}`,
  /** A move's record. */
  move: (moveId: string): string => `move:${moveId}`,
  /** The queue: a session was queued (a drain has something to place). */
  queue: "queue",
  /** The fleet's room, where no record above changed: a host's report, an external reservation. */
  fleet: "fleet",
  /** A host's credential: rotated, or the host removed. */
  credential: (hostId: string): string => `credential:${hostId}`,
} as const

/** The subscribers of one process and their delivery; a backend's `Changes` builds on it. */
export interface Hub {
  /** Delivers `topics` to every subscriber of this process. */
  readonly deliver: (topics: readonly string[]) => void
  /** Tells every subscriber of this process that notices may have been lost. */
  readonly miss: () => void
  readonly subscribe: ChangesShape["subscribe"]
}

/** A new hub of subscribers. */
export const makeHub = (): Hub => {
  const listeners = new Set<Listener>()
  return {
    deliver: (topics) => {
      if (topics.length === 0) return
      for (const l of listeners) l.changed(topics)
    },
    miss: () => {
      for (const l of listeners) l.missed()
    },
    subscribe: (listener) =>
      Effect.acquireRelease(
        Effect.sync(() => listeners.add(listener)),
        () => Effect.sync(() => listeners.delete(listener)),
      ).pipe(Effect.asVoid),
  }
}

/**
 * Notices within one process: every subscriber of this instance hears every publish. Shared by
 * the coordinators of one process on one in-memory store (as replicas share `ChangesPg`).
 */
export const makeLocalChanges = (): ChangesShape => {
  const hub = makeHub()
  return {
    publish: (topics) => Effect.sync(() => hub.deliver([...new Set(topics)])),
    subscribe: hub.subscribe,
    live: () => true,
  }
}

/** The change notices service. */
export class Changes extends Context.Service<Changes, ChangesShape>()("@engram/store/Changes") {
  /** Notices within this process only: right where no other process writes the store. */
  static readonly local: Layer.Layer<Changes> = Layer.sync(Changes, () => Changes.of(makeLocalChanges()))
}
