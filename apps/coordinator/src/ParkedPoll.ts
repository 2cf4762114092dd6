/**
 * The agent's assignments long-poll, parking no fiber while it waits (`Parking`): the same
 * answers as `Assignments.poll` run by `LongPolls.run` (the caps' 429, a revocation's 401, the
 * answer by the deadline, the copy in memory answered), with the state of an open poll a few
 * plain objects (this `Poll`, its watch, its ticket) instead of a request's fiber parked inside the
 * API builder.
 */
import type { Records, TooManyRequests, Unauthorized } from "@engram/api"
import { Clock, Effect, Exit } from "effect"
import type { HttpServerResponse } from "effect/http"
import { maxWaitMs } from "./Assignments.js"
import type { LongPollsShape, Restore, Ticket } from "./LongPolls.js"
import type { NotifierShape, OpenWatch, Parker, Woken } from "./Notifier.js"
import { hostTopic } from "./Notifier.js"
import * as Parking from "./Parking.js"

/** One open poll: its watch and ticket from its admission; filed while parked, taken back when the route runs again. */
class Poll implements Parking.Park, Parker {
  wake: (() => void) | null = null
  /** Why its parked wait answered (null while it waits). */
  why: Woken | null = null
  /** The version it waits to change, and its deadline (Effect Clock), once its first read answered. */
  baseline = ""
  deadline = 0
  /** What was read last. */
  latest: Records.Assignments | null = null
  constructor(
    readonly ticket: Ticket | null,
    readonly watch: OpenWatch,
    readonly release: (ticket: Ticket) => void,
  ) {}
  get admitted(): Ticket["credential"] | null {
    return this.ticket === null ? null : this.ticket.credential
  }
  get due(): boolean {
    return this.why !== null
  }
  woken(why: Woken): void {
    this.why = why
    const w = this.wake
    this.wake = null
    w?.()
  }
  /** Whether `abandon` ran: a poll is released once (a second release would undercount its credential's open polls). */
  private released = false
  abandon(): void {
    if (this.released) return
    this.released = true
    this.watch.close()
    if (this.ticket !== null) this.release(this.ticket)
  }
}

/**
 * The assignments poll of `hostId` for the request `request` (its `HttpServerRequest`): answers
 * the assignments, or `Parking.parked` when it parked (the edge runs the route again once it is
 * woken, and this carries on). `read` reads the host's assignments, its errors mapped to the API's.
 */
export const make =
  <E, R>(notifier: NotifierShape, longPolls: LongPollsShape, read: (hostId: string) => Effect.Effect<Records.Assignments, E, R>) =>
  (
    request: object,
    hostId: string,
    options: { readonly waitMs: number; readonly since: string | undefined },
  ): Effect.Effect<Records.Assignments | HttpServerResponse.HttpServerResponse, E | TooManyRequests | Unauthorized, R> => {
    /** While nothing changed and the deadline is ahead, parks (`parked`); else the latest read. `why`: why its last wait answered (null: it has not waited). */
    const loop = (p: Poll, latest: Records.Assignments, why: Woken | null): Effect.Effect<Records.Assignments | HttpServerResponse.HttpServerResponse, E, R> => {
      // Nothing changed by the deadline (or the poll was ended: its credential revoked, the
      // coordinator stopping): what was read last is still the latest.
      if (why === "timeout" || why === "ended") return Effect.succeed(latest)
      return Effect.flatMap(why === null ? Effect.succeed(latest) : read(hostId), (latest) => {
        p.latest = latest
        if (latest.version !== p.baseline) return Effect.succeed(latest)
        return Effect.flatMap(Clock.currentTimeMillis, (now) => {
          const remaining = p.deadline - now
          if (remaining <= 0) return Effect.succeed(latest)
          const answered = p.watch.park(now, remaining, p)
          if (answered !== null) return loop(p, latest, answered)
          Parking.file(request, p)
          return Effect.succeed(Parking.parked)
        })
      })
    }
    /** Runs `body` owning `p`: its answer settled (`LongPolls`), then `p` released, unless it parked. */
    const owned = (p: Poll, restore: Restore, body: Effect.Effect<Records.Assignments | HttpServerResponse.HttpServerResponse, E, R>) =>
      Effect.onExit(
        restore(Effect.flatMap(Effect.exit(body), (exit) => (Exit.isSuccess(exit) && exit.value === Parking.parked ? exit : longPolls.settle(p.ticket, exit)))),
        (exit) => (Exit.isSuccess(exit) && exit.value === Parking.parked ? Effect.void : Effect.sync(() => p.abandon())),
      )
    return Effect.uninterruptibleMask((restore) =>
      Effect.suspend(() => {
        const resumed = Parking.take(request)
        if (resumed instanceof Poll && resumed.latest !== null) {
          const why = resumed.why
          resumed.why = null
          return owned(resumed, restore, loop(resumed, resumed.latest, why))
        }
        resumed?.abandon()
        return Effect.flatMap(longPolls.admit(restore), (ticket) => {
          // Watching before the first read: a change made while it runs wakes the wait below.
          const p = new Poll(ticket, notifier.open([hostTopic(hostId) as string], ticket?.end ?? null), longPolls.release)
          const first = Effect.flatMap(read(hostId), (latest) => {
            const wait = Math.min(options.waitMs, maxWaitMs)
            if (wait <= 0) return Effect.succeed(latest)
            return Effect.flatMap(Clock.currentTimeMillis, (now) => {
              p.baseline = options.since ?? latest.version
              p.deadline = now + wait
              return loop(p, latest, null)
            })
          })
          return owned(p, restore, first)
        })
      }),
    )
  }
