/**
 * What every long-poll (an agent's assignments, a wait for a session's state, the dashboard's
 * `/ui/changes`, `Ui.ts`) goes through:
 * the caps on how many are open at once, per credential and in total (beyond them, 429 with
 * `Retry-After`: a host's agent needs one or two, a runaway client would otherwise hold memory
 * and sockets without bound), and revocation (a host token rotated or removed through any
 * replica ends its open long-polls with 401 at once: the poll's `WaitEnd` answers its wait).
 */
import { TooManyRequests, Unauthorized } from "@engram/api"
import { Changes } from "@engram/store"
import { Array as Arr, Context, Effect, Layer } from "effect"
import type { Exit } from "effect"
import type { Credential } from "./Auth.js"
import { Credentials, CurrentCredential } from "./Auth.js"
import { maxGroupedReads } from "./GroupedReads.js"
import { credentialTopic, endWaits, makeWaitEnd, WaitEnd } from "./Notifier.js"
import type { WaitEndHandle } from "./Notifier.js"
import { Settings } from "./Settings.js"
import { addTo, removeFrom } from "./SetsByKey.js"

/** How long a client refused for too many long-polls should wait before it tries again. */
export const retryAfterMs = 1000

/**
 * How many credential reads a possible miss of notices runs at once, to check the open host polls,
 * on a store without a grouped read of hosts' token hashes (`Store.hostTokenHashes`): one read
 * per token. With it, the check reads one group of up to `maxGroupedReads` hosts at a time.
 */
export const missSweepConcurrency = 8

/** The caps on open long-polls. */
export interface Caps {
  /** Per host token (an agent holds one; a second covers its restart). */
  readonly perHostToken: number
  /** Per admin token (every tool and service that uses it shares the cap). */
  readonly perAdminToken: number
  /** In total, on this replica. */
  readonly total: number
}

/** An admitted long-poll (`LongPollsShape.admit`), counted and revocable until released. */
export interface Ticket {
  /** The credential admitted. */
  readonly credential: Credential
  /** Ends the poll's waits (its credential revoked, or the coordinator stopping): open its watch with it. */
  readonly end: WaitEndHandle
}

/** Makes a region interruptible again inside `Effect.uninterruptibleMask` (its `restore`). */
export type Restore = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>

export interface LongPollsShape {
  /**
   * Runs a long-poll of the current request's credential: 429 beyond the caps, 401 as soon as
   * the credential is revoked (the wait is interrupted), else the wait's own answer.
   */
  readonly run: <A, E, R>(wait: Effect.Effect<A, E, R>) => Effect.Effect<A, E | TooManyRequests | Unauthorized, R>
  /**
   * `run`'s parts, for a long-poll that holds no fiber while it waits (`ParkedPoll`): admits one
   * of the current request's credential (429 beyond the caps, 401 when revoked since it was
   * authenticated; null when the request has none: nothing to count), `restore` making its store
   * read interruptible (the caller holds the ticket in `Effect.uninterruptibleMask`, so no
   * interruption falls between the ticket and its owner). The ticket counts until `release`d.
   */
  readonly admit: (restore: Restore) => Effect.Effect<Ticket | null, TooManyRequests | Unauthorized>
  /** The answer of an admitted poll whose wait ended, as `run` gives it (401 when its credential was revoked meanwhile). */
  readonly settle: <A, E>(ticket: Ticket | null, answer: Exit.Exit<A, E>) => Effect.Effect<A, E | Unauthorized>
  /** Releases an admitted poll's ticket (it no longer counts against the caps). */
  readonly release: (ticket: Ticket) => void
  /** How many long-polls are open now. */
  readonly open: () => number
  /**
   * The sweeps after possible misses of notices: `done`, those that checked every open host
   * poll's credential; `failed`, the tries a store failure cut short (each tried again).
   */
  readonly sweeps: () => { readonly done: number; readonly failed: number }
  /**
   * Ends every open long-poll's wait (the coordinator is stopping): each answers at once what it
   * would at its deadline, so the server's drain does not wait out the polls, and the agents ask
   * again (another replica, as this one answers 503 from then on). Long-polls begun after it
   * answer at once too.
   */
  readonly endAll: Effect.Effect<void>
}

export class LongPolls extends Context.Service<LongPolls, LongPollsShape>()("@engram/coordinator/LongPolls") {
  static readonly layer: Layer.Layer<LongPolls, never, Settings | Credentials | Changes> = Layer.effect(
    LongPolls,
    Effect.gen(function* () {
      const changes = yield* Changes
      const scope = yield* Effect.scope
      const config = (yield* Settings).config
      const caps: Caps = { perHostToken: config.maxWaitsPerHostToken, perAdminToken: config.maxWaitsPerAdminToken, total: config.maxWaits }
      const credentials = yield* Credentials
      const byCredential = new Map<string, number>()

      const refuse = (limit: number, whose: string) =>
        new TooManyRequests({
          error: "TooManyWaits",
          message: `${whose} already holds ${limit} open long-polls; retry after one answers`,
          retryAfterMs,
          limit,
        })
      // The open long-polls of host tokens, by host: a credential notice checks each one's token
      // (after the notice dropped the credential's copy) and ends the revoked ones with 401.
      // Its `end` (the ticket's) ends the poll's waits when its credential is revoked: they answer at once, and the poll 401.
      interface Open extends Ticket {
        /** A credential notice of its host came while it was open (set at once, before the check's store read). */
        touched: boolean
      }
      const openByHost = new Map<string, Set<Open>>()
      /** Every open long-poll (the total cap, `endAll`), and whether they were all ended (the coordinator stopping). */
      const all = new Set<Open>()
      let stopping = false
      const revokedError = (hostId: string) => new Unauthorized({ error: "Unauthorized", message: `the token of host ${hostId} was revoked (rotated, or the host removed)` })
      /** Whether `hash` still acts for `hostId` (true while the store is away: the next request is authenticated afresh). */
      const acts = (hash: string, hostId: string) =>
        Effect.map(credentials.principalOf(hash), (now) => now !== null && now._tag === "Host" && now.hostId === hostId)
      const stillActs = (hash: string, hostId: string) => Effect.orElseSucceed(acts(hash, hostId), () => true)
      /** Ends the polls (all of `hostId`) whose credential no longer acts, by `actsNow`. */
      const check = <E>(hostId: string, polls: ReadonlySet<Open>, actsNow: (hash: string, hostId: string) => Effect.Effect<boolean, E>) =>
        Effect.forEach(
          new Map([...polls].map((p) => [p.credential.tokenHash, p])).values(),
          (p) =>
            Effect.map(actsNow(p.credential.tokenHash, hostId), (still) => {
              if (still) return
              for (const q of polls) if (q.credential.tokenHash === p.credential.tokenHash) endWaits(q.end)
            }),
          { discard: true },
        )
      /**
       * Ends the polls of `group` (hosts and their open polls) whose credential no longer acts, by
       * one grouped read of the hosts' credentials (`Credentials.actingHosts`).
       */
      const checkGroup = (group: ReadonlyArray<readonly [string, ReadonlySet<Open>]>, actingHosts: NonNullable<typeof credentials.actingHosts>) => {
        const held = group.flatMap(([hostId, polls]) => [...new Set([...polls].map((p) => p.credential.tokenHash))].map((tokenHash) => ({ tokenHash, hostId })))
        return Effect.map(actingHosts(held), (acting) => {
          for (const [, polls] of group) for (const p of polls) if (!acting.has(p.credential.tokenHash)) endWaits(p.end)
        })
      }
      // One sweep after misses at a time (misses while it runs sweep once more after it). A sweep
      // stops at the first read the store fails and is tried again after `retryAfterMs` (the store
      // is away: a read per group would each wait out the store's bound; one failed read a second
      // while it is away), until one completes. Reads that succeeded are kept by the credentials'
      // copy, so a sweep tried again asks the store only for what is left.
      let sweeping = false
      let missedAgain = false
      const sweeps = { done: 0, failed: 0 }
      const sweepAfterMiss: Effect.Effect<void> = Effect.suspend(() => {
        if (!missedAgain) {
          // In the same step as the check: a miss after it starts a sweep of its own.
          sweeping = false
          sweeps.done++
          return Effect.void
        }
        missedAgain = false
        const open = [...openByHost].map(([hostId, polls]): readonly [string, ReadonlySet<Open>] => {
          for (const p of polls) p.touched = true
          return [hostId, new Set(polls)]
        })
        const actingHosts = credentials.actingHosts
        const checks =
          actingHosts === undefined
            ? Effect.forEach(open, ([hostId, polls]) => check(hostId, polls, acts), { concurrency: missSweepConcurrency, discard: true })
            : Effect.forEach(Arr.chunksOf(open, maxGroupedReads), (group) => checkGroup(group, actingHosts), { discard: true })
        return Effect.matchEffect(checks, {
          onFailure: () =>
            Effect.andThen(
              Effect.sleep(retryAfterMs),
              Effect.suspend(() => {
                sweeps.failed++
                missedAgain = true
                return sweepAfterMiss
              }),
            ),
          onSuccess: () => sweepAfterMiss,
        })
      })
      const prefix = credentialTopic("")
      yield* changes.subscribe({
        changed: (topics) => {
          for (const t of topics) {
            if (!t.startsWith(prefix)) continue
            const hostId = t.slice(prefix.length)
            const polls = openByHost.get(hostId)
            // A copy: the polls open now are the ones the notice is about.
            if (polls === undefined) continue
            for (const p of polls) p.touched = true
            Effect.runFork(Effect.forkIn(check(hostId, new Set(polls), stillActs), scope))
          }
        },
        // A possible miss (the LISTEN connection came back, a replica left uncleanly) may have
        // carried a rotation or removal: every open host poll is touched and its credential
        // checked, one read of `maxGroupedReads` hosts at a time (a read per poll would put
        // thousands of statements on the pool ahead of heartbeats and creates; on a store
        // without the grouped read, `missSweepConcurrency` reads of one token at a time).
        missed: () => {
          if (openByHost.size === 0) return
          missedAgain = true
          if (sweeping) return
          sweeping = true
          Effect.runFork(Effect.forkIn(Effect.onInterrupt(sweepAfterMiss, () => Effect.sync(() => (sweeping = false))), scope))
        },
      })

      /** Admits a long-poll of `c` (429 beyond the caps) and files it for revocation; `leave` undoes both. */
      const enter = (c: Credential): Effect.Effect<Open, TooManyRequests> =>
        Effect.suspend(() => {
          const limit = c.principal._tag === "Admin" ? caps.perAdminToken : caps.perHostToken
          const held = byCredential.get(c.tokenHash) ?? 0
          if (held >= limit) return Effect.fail(refuse(limit, c.principal._tag === "Admin" ? "the admin token" : `the token of host ${c.principal.hostId}`))
          if (all.size >= caps.total) return Effect.fail(refuse(caps.total, "this coordinator"))
          byCredential.set(c.tokenHash, held + 1)
          const p: Open = { credential: c, end: makeWaitEnd(), touched: false }
          if (c.principal._tag === "Host") addTo(openByHost, c.principal.hostId, p)
          all.add(p)
          if (stopping) endWaits(p.end)
          return Effect.succeed(p)
        })
      const leaveNow = (p: Open) => {
        const c = p.credential
        const held = (byCredential.get(c.tokenHash) ?? 1) - 1
        if (held <= 0) byCredential.delete(c.tokenHash)
        else byCredential.set(c.tokenHash, held)
        if (c.principal._tag === "Host") removeFrom(openByHost, c.principal.hostId, p)
        all.delete(p)
      }
      const leave = (p: Open) => Effect.sync(() => leaveNow(p))

      /**
       * A host's poll, filed (later notices touch it), is refused with 401 when a credential
       * notice came between its authentication and now and its credential no longer acts: a
       * rotation or removal in that window found no open poll to end, and the poll would
       * otherwise wait its full time and answer the revoked token with data.
       */
      const admitted = (c: Credential): Effect.Effect<void, Unauthorized> =>
        Effect.suspend(() => {
          if (c.principal._tag !== "Host" || stopping || credentials.notices() === c.noticesAt) return Effect.void
          const hostId = c.principal.hostId
          return Effect.flatMap(stillActs(c.tokenHash, hostId), (acts) => (acts ? Effect.void : Effect.fail(revokedError(hostId))))
        })

      /** The answer of an admitted poll whose wait ended (`answer`): 401 when its credential was revoked meanwhile. */
      const settled = <A, E>(p: Open, answer: Exit.Exit<A, E>): Effect.Effect<A, E | Unauthorized> => {
        const c = p.credential
        // Ended because the coordinator stops: the wait's own answer, not a revocation.
        if (c.principal._tag !== "Host" || stopping) return answer
        const hostId = c.principal.hostId
        if (p.end.ended) return Effect.fail(revokedError(hostId))
        // The same notice that revoked the credential (a host removed) can wake the wait before
        // the revocation's check has read the store: a poll touched by a credential notice
        // answers (a success or an error) only once its credential is known to still act.
        if (!p.touched) return answer
        return Effect.flatMap(stillActs(c.tokenHash, hostId), (acts): Effect.Effect<A, E | Unauthorized> => (acts ? answer : Effect.fail(revokedError(hostId))))
      }

      // No fiber of its own: the wait runs in the request's fiber, with the poll's `WaitEnd` in
      // context, so a revocation ends the wait's watch (`Notifier`) rather than racing it.
      const run: LongPollsShape["run"] = <A, E, R>(wait: Effect.Effect<A, E, R>) =>
        Effect.flatMap(Effect.serviceOption(CurrentCredential), (credential) => {
          if (credential._tag === "None") return wait
          const c = credential.value
          return Effect.acquireUseRelease(
            enter(c),
            (p) => Effect.andThen(admitted(c), Effect.flatMap(Effect.exit(Effect.provideService(wait, WaitEnd, p.end)), (answer) => settled(p, answer))),
            leave,
          )
        })
      const admit: LongPollsShape["admit"] = (restore) =>
        Effect.flatMap(Effect.serviceOption(CurrentCredential), (credential): Effect.Effect<Ticket | null, TooManyRequests | Unauthorized> => {
          if (credential._tag === "None") return Effect.succeed(null)
          const c = credential.value
          return Effect.flatMap(enter(c), (p) => Effect.as(Effect.onExit(restore(admitted(c)), (exit) => (exit._tag === "Failure" ? leave(p) : Effect.void)), p))
        })
      const settle: LongPollsShape["settle"] = (ticket, answer) => (ticket === null ? answer : settled(ticket as Open, answer))
      const release: LongPollsShape["release"] = (ticket) => leaveNow(ticket as Open)
      const endAll = Effect.sync(() => {
        stopping = true
        for (const p of all) endWaits(p.end)
      })
      return LongPolls.of({ run, admit, settle, release, open: () => all.size, sweeps: () => ({ ...sweeps }), endAll })
    }),
  )
}
