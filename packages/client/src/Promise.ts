/**
 * The client for code that does not use Effect: every call of `EngramClient` as a function
 * answering a Promise, which rejects with one of `Errors`' classes (so `instanceof` tells them
 * apart), and async iterators over whole lists.
 *
 * ```ts
 * const engram = createClient({ baseUrl: "http://127.0.0.1:7070", token: process.env.ENGRAM_TOKEN! })
 * const placed = await engram.sessions.create({ memMib: 1024, vcpus: 1 })
 * for await (const s of engram.sessions.all({ state: "parked" })) console.log(s.id)
 * ```
 */
import { Cause, Effect, Exit } from "effect"
import { FetchHttpClient } from "effect/http"
import type { EngramClientShape, Move, MovesQuery, Options, ReservationsQuery, SessionsQuery } from "./EngramClient.js"
import { make } from "./EngramClient.js"
import type * as Page from "./Page.js"
import type { Records } from "@engram/api"

/** A shape of Effect-returning functions as Promise-returning ones. */
export type Promised<T> = {
  readonly [K in keyof T]: T[K] extends (...args: infer P) => Effect.Effect<infer A, infer _E, infer _R>
    ? (...args: P) => Promise<A>
    : T[K] extends object
      ? Promised<T[K]>
      : T[K]
}

/** The Promise client. */
export interface Engram extends Promised<Omit<EngramClientShape, "sessions" | "hosts" | "reservations" | "moves">> {
  readonly sessions: Promised<EngramClientShape["sessions"]> & {
    /** Every session of the filter, fetched a page at a time as you iterate. */
    readonly all: (query?: Omit<SessionsQuery, "cursor">) => AsyncIterable<Records.Session>
  }
  readonly hosts: Promised<EngramClientShape["hosts"]> & { readonly all: () => AsyncIterable<Records.Host> }
  readonly reservations: Promised<EngramClientShape["reservations"]> & {
    readonly all: (query?: Omit<ReservationsQuery, "cursor">) => AsyncIterable<Records.Reservation>
  }
  readonly moves: Promised<EngramClientShape["moves"]> & { readonly all: (query?: Omit<MovesQuery, "cursor">) => AsyncIterable<Move> }
}

/** Runs a call; a failure rejects with the error itself (not wrapped), a defect with its cause. */
const toPromise = async <A>(eff: Effect.Effect<A, unknown>): Promise<A> => {
  const exit = await Effect.runPromiseExit(eff)
  if (Exit.isSuccess(exit)) return exit.value
  const failure = exit.cause.reasons.find(Cause.isFailReason)
  throw failure !== undefined ? failure.error : Cause.squash(exit.cause)
}

const promised = <T extends object>(shape: T): Promised<T> =>
  Object.fromEntries(
    Object.entries(shape).map(([k, v]) => [
      k,
      typeof v === "function" ? (...args: unknown[]) => toPromise((v as (...a: unknown[]) => Effect.Effect<unknown, unknown>)(...args)) : typeof v === "object" && v !== null ? promised(v) : v,
    ]),
  ) as Promised<T>

/** Iterates a list page by page. */
async function* pages<A>(fetch: (cursor: string | undefined) => Promise<Page.Page<A>>): AsyncGenerator<A> {
  let cursor: string | undefined = undefined
  for (;;) {
    const page: Page.Page<A> = await fetch(cursor)
    yield* page.items
    if (page.nextCursor === null || page.nextCursor === cursor) return
    cursor = page.nextCursor
  }
}

/** A client of the coordinator at `baseUrl`, calling with `token` (over the platform's `fetch`). */
export const createClient = (options: Options): Engram => {
  const shape = Effect.runSync(make(options).pipe(Effect.provide(FetchHttpClient.layer)))
  const base = promised(shape)
  return {
    ...base,
    sessions: { ...base.sessions, all: (q = {}) => pages((cursor) => base.sessions.list({ ...q, cursor })) },
    hosts: { ...base.hosts, all: () => pages((cursor) => base.hosts.list({ cursor })) },
    reservations: { ...base.reservations, all: (q = {}) => pages((cursor) => base.reservations.list({ ...q, cursor })) },
    moves: { ...base.moves, all: (q = {}) => pages((cursor) => base.moves.list({ ...q, cursor })) },
  }
}
