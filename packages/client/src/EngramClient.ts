/**
 * The Effect-native client: `EngramClient`, every call by resource (`sessions`, `hosts`,
 * `fleet`, `reservations`, `moves`), each an `Effect` that fails with one of `Errors`' classes
 * (`Effect.catchTag("NotFound", …)`). It is `@engram/api`'s `HttpApiClient` (paths, payloads,
 * answers and error statuses all come from the API's definition) with friendlier arguments.
 * `EngramClient.layer(options)` needs an `HttpClient`; `EngramClient.layerFetch(options)` brings
 * the platform's `fetch`.
 *
 * ```ts
 * const program = Effect.gen(function* () {
 *   const engram = yield* EngramClient
 *   const placed = yield* engram.sessions.create({ memMib: 1024, vcpus: 1 })
 *   return yield* engram.sessions.wait(placed.id, { state: "running" })
 * })
 * program.pipe(Effect.provide(EngramClient.layerFetch({ baseUrl: "http://127.0.0.1:7070", token })))
 * ```
 */
import { Client } from "@engram/api"
import type { Payloads, Records, StrictJson } from "@engram/api"
import { Cause, Context, Duration, Effect, Layer, Redacted } from "effect"
import { FetchHttpClient } from "effect/http"
import type { HttpClient } from "effect/http"
import * as Errors from "./Errors.js"
import * as Page from "./Page.js"
import * as Replicas from "./Replicas.js"

/** Where the coordinator is and the token to call it with. */
export interface Options {
  /**
   * The coordinator's URL, e.g. `http://127.0.0.1:7070`; or its replicas' (a list), tried in
   * turn: a call that finds one unreachable (`Replicas.unreachable`: no connection, a gateway's
   * 502/503/504, the API's 503 `Unavailable` of a replica shutting down or cut off from its store)
   * goes at once to the next, each at most once per call, and the client stays on the one that
   * answered. A list breaking `Replicas.parseUrls`' rule is a defect (check it first).
   */
  readonly baseUrl: string | URL | readonly (string | URL)[]
  /** The admin token (or a host's own token, which acts for its own host only). */
  readonly token: string | Redacted.Redacted<string>
  /**
   * How long one try on one replica may go unanswered before it counts as hung (ms, an integer
   * > 0; default 30,000): a replica that froze (a stopped process, a dead network path) holds no
   * call forever. A hung try is unreachable (`Replicas.unreachable`): the call moves to the next
   * replica if it is safe to repeat (every call but a move and a reservation without an id: a
   * create given no id gets one here), else fails as a `TransportError` saying no answer came in
   * time (it may have been done). A wait's hold and a move's
   * (`moveHoldMs`) are added to it.
   */
  readonly timeoutMs?: number | undefined
  /**
   * The longest a move's call is held by the coordinator (ms; default 120,000, the coordinator's
   * `ENGRAM_MOVE_TIMEOUT_MS` default): a move's try may take this plus `timeoutMs`.
   */
  readonly moveHoldMs?: number | undefined
  /**
   * Told the replica's URL each time a try on it went unanswered past its bound (a hang, not a
   * refused connection): a caller that makes a new client per command (the CLI) can try that
   * replica last for a while instead of paying the whole bound again.
   */
  readonly onHung?: ((url: string) => void) | undefined
}

/** `Options.timeoutMs`' default. */
export const defaultTimeoutMs = 30_000
/** `Options.moveHoldMs`' default. */
export const defaultMoveHoldMs = 120_000

/** An input of the API as a call takes it: an optional field may also be `undefined` (sent as absent). */
export type Input<T> = { readonly [K in keyof T]: object extends Pick<T, K> ? T[K] | undefined : T[K] }

/** `sessions.create`'s input (`POST /v1/sessions`). */
export type CreateSession = Input<Payloads.CreateSession>

/** `sessions.list`'s filter. */
export interface SessionsQuery extends Page.PageQuery {
  readonly state?: Records.SessionState | undefined
  readonly hostId?: string | undefined
}

/** `sessions.wait`'s target. */
export interface WaitFor {
  readonly state: Records.SessionState
  /** How long the coordinator holds the request (at most 60 s); default 30 s. */
  readonly timeoutMs?: number | undefined
}

/** `sessions.move`'s budget and target (`POST /v1/sessions/{id}/move`). */
export type MoveOptions = Input<Payloads.StartMove>

/**
 * A move as the client answers it: the API's record with `resendOwed` always there (true while the
 * move's source holds the guest's only whole copy, paused, and owes its target the stream) and
 * `committedBy` always there (who committed it: `source`, `target` or `operator`; null while not
 * committed). A coordinator older than a field leaves it out: `resendOwed` reads as false,
 * `committedBy` as null.
 */
export type Move = Records.Move & { readonly resendOwed: boolean; readonly committedBy: Records.MoveCommittedBy | null }

/** The move with `resendOwed` as a boolean (false when the coordinator left it out) and `committedBy` (null when left out). */
export const withResendOwed = (m: Records.Move): Move => ({ ...m, resendOwed: m.resendOwed === true, committedBy: m.committedBy ?? null })

/** `moves.list`'s filter. */
export interface MovesQuery extends Page.PageQuery {
  readonly hostId?: string | undefined
  readonly state?: Records.MoveState | undefined
}

/** `reservations.list`'s filter. */
export interface ReservationsQuery extends Page.PageQuery {
  readonly hostId?: string | undefined
}

/**
 * The answer of a create or a resume, tagged by `outcome`: `placed` (it holds a host: 201, or a
 * warm resume's 200) or `queued` (202: its position, each host's reason, `tooBig`). A resume's
 * answer also says how it came back (`resumed`: `warm` or `cold`).
 */
export type PlaceAnswer =
  | ({ readonly outcome: "placed"; readonly resumed?: Records.Resumed } & Records.Placed)
  | ({ readonly outcome: "queued"; readonly resumed?: Records.Resumed } & Records.Queued)

type Fx<A> = Effect.Effect<A, Errors.ClientError>

/** Every call, by resource. */
export interface EngramClientShape {
  readonly baseUrl: string
  readonly sessions: {
    /** Places a session, or queues it (`outcome: "queued"` with its position and each host's reason). */
    readonly create: (input: CreateSession) => Fx<PlaceAnswer>
    /** One session; while it is queued, `queue` says where it stands and why. */
    readonly get: (id: string) => Fx<Records.SessionDetail>
    /** One page of sessions, oldest first. */
    readonly list: (query?: SessionsQuery) => Fx<Page.Page<Records.Session>>
    /** Every session of the filter, page after page. */
    readonly listAll: (query?: Omit<SessionsQuery, "cursor">) => Fx<readonly Records.Session[]>
    /** A running session went idle: the park gate parks it (paused in RAM) or descends it. */
    readonly idle: (id: string) => Fx<Records.Idled>
    /** Parked → running on the same host (`resumed: "warm"`), or descended → restored (`"cold"`, placed or queued). */
    readonly resume: (id: string) => Fx<PlaceAnswer>
    /** Ends a session from any state; its room is released. */
    readonly end: (id: string) => Fx<Records.Session>
    /** A new TTL: the session ends `ttlMs` from now, whatever its state (extends or shortens it). */
    readonly setTtl: (id: string, ttlMs: number) => Fx<Records.Session>
    /** Moves a running session live within `maxDowntimeMs`; fails with `MoveDowntime` (and the estimate) when the guard refuses. */
    readonly move: (id: string, options: MoveOptions) => Fx<Records.MoveCommitted>
    /** Waits until the session is in `state`: `WaitTimeout` when time runs out, `Unreachable` when it can no longer get there. */
    readonly wait: (id: string, target: WaitFor) => Fx<Records.SessionDetail>
    /** One page of the session's history, oldest first. */
    readonly events: (id: string, query?: Page.PageQuery) => Fx<Page.Page<Records.SessionEvent>>
    /** The session's whole history, oldest first, following the pages (`limit` per page, default 1000). */
    readonly eventsAll: (id: string, query?: Omit<Page.PageQuery, "cursor">) => Fx<readonly Records.SessionEvent[]>
  }
  readonly hosts: {
    /** Registers a host; answers its agent's token (shown this once). */
    readonly create: (input: Input<Payloads.CreateHost>) => Fx<Records.HostCreated>
    readonly get: (id: string) => Fx<Records.Host>
    readonly list: (query?: Page.PageQuery) => Fx<Page.Page<Records.Host>>
    readonly listAll: () => Fx<readonly Records.Host[]>
    readonly cordon: (id: string) => Fx<Records.Host>
    readonly uncordon: (id: string) => Fx<Records.Host>
    readonly drain: (id: string) => Fx<Records.Host>
    /** Removes a host and answers it as it was (`Conflict` while it holds reservations). */
    readonly remove: (id: string) => Fx<Records.Host>
    /** A new token for the host's agent; the old one stops working. */
    readonly rotateToken: (id: string) => Fx<Records.HostToken>
    /** The guard's learned commit allowance of moves from the host, per target host (SPEC §13). */
    /** With `targetHostId`, only the pair to that host, listed even without commits of its own. */
    readonly allowances: (id: string, query?: { readonly targetHostId?: string }) => Fx<Records.HostAllowances>
  }
  readonly fleet: {
    /** The fleet signal: hosts by state, capacity, reserved and free room, the queue, parks, descents. */
    readonly snapshot: () => Fx<Records.Fleet>
    /** Whether a budget would fit now, and each host's reason. */
    readonly noFit: (budget: Records.Budget) => Fx<Records.NoFit>
  }
  readonly reservations: {
    readonly reserve: (input: Input<Payloads.Reserve>) => Fx<Records.Reservation>
    readonly get: (id: string) => Fx<Records.Reservation>
    readonly list: (query?: ReservationsQuery) => Fx<Page.Page<Records.Reservation>>
    readonly listAll: (query?: Omit<ReservationsQuery, "cursor">) => Fx<readonly Records.Reservation[]>
    readonly release: (id: string) => Fx<Records.Reservation>
    readonly heartbeat: (id: string) => Fx<Records.Reservation>
    readonly summary: () => Fx<Records.ClusterSummary>
    readonly metrics: () => Fx<Records.LedgerMetrics>
  }
  readonly moves: {
    readonly get: (id: string) => Fx<Move>
    readonly list: (query?: MovesQuery) => Fx<Page.Page<Move>>
    readonly listAll: (query?: Omit<MovesQuery, "cursor">) => Fx<readonly Move[]>
    /**
     * Ends an in-doubt move (SPEC §13): `commit` (the guest runs on the target) or `abort` (on the
     * source). A move whose source owes a resend (`resendOwed`) is committed already: it refuses
     * both (`Conflict`).
     */
    readonly resolve: (id: string, outcome: "commit" | "abort", reason: string) => Fx<Move>
  }
  /** Whether the coordinator serves and its store answers (no token needed). */
  readonly ready: () => Fx<Records.Ready>
}

/** The input without its `undefined` fields: the API's schemas tell an absent field from an undefined one. */
const defined = <T extends object>(o: T): { [K in keyof T]: Exclude<T[K], undefined> } =>
  Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as { [K in keyof T]: Exclude<T[K], undefined> }

/** A create's or resume's answer, tagged: a queued one carries its `position`. */
const tagged = (a: Records.Placed | Records.Queued | Records.ResumedWarm | Records.ResumedPlaced | Records.ResumedQueued): PlaceAnswer =>
  "position" in a ? { outcome: "queued", ...a } : { outcome: "placed", ...a }

/** An id for a create given none: a random UUID (the platform's `crypto`, Node and browsers). */
const newId = (): string => globalThis.crypto.randomUUID()

/**
 * Whether the reservation the ledger holds is the one a reserve asked for: the same host, owner
 * and figures (and the optional ones, where the request named them). A repeated reserve whose
 * first answer was lost finds its own reservation under its id; another with the id is not it.
 */
const sameReservation = (held: Records.Reservation, asked: Input<Payloads.Reserve>): boolean =>
  held.hostId === asked.hostId &&
  held.ownerKind === asked.ownerKind &&
  held.ownerId === asked.ownerId &&
  held.memMib === asked.memMib &&
  held.vcpus === asked.vcpus &&
  (asked.vramMib === undefined || held.vramMib === asked.vramMib) &&
  (asked.expiresAt === undefined || held.expiresAt === asked.expiresAt) &&
  (asked.description === undefined || held.description === asked.description)

/** Builds a client on an `HttpClient`. */
export const make = (options: Options): Effect.Effect<EngramClientShape, never, HttpClient.HttpClient> =>
  Effect.gen(function* () {
    const given = (Array.isArray(options.baseUrl) ? options.baseUrl : [options.baseUrl]).map(String)
    const parsed = given.length === 1 ? { urls: given } : Replicas.parseUrls(given.join(","))
    if (!("urls" in parsed)) return yield* Effect.die(new Error(`coordinator urls ${JSON.stringify(Replicas.redactUrl(given.join(",")))}: ${parsed.problem}`))
    const urls = parsed.urls.map(Replicas.baseUrlOf)
    const baseUrl = urls.join(",")
    const token = typeof options.token === "string" ? Redacted.make(options.token) : options.token
    const apis = yield* Effect.forEach(urls, (url) => Client.make({ baseUrl: url, token }))
    for (const [field, value] of [["timeoutMs", options.timeoutMs], ["moveHoldMs", options.moveHoldMs]] as const)
      if (value !== undefined && !(Number.isSafeInteger(value) && value > 0)) return yield* Effect.die(new Error(`${field} ${JSON.stringify(value)}: must be an integer > 0 (ms)`))
    const timeoutMs = options.timeoutMs ?? defaultTimeoutMs
    const moveHoldMs = options.moveHoldMs ?? defaultMoveHoldMs
    /** The replica in use: the last one that answered. */
    let current = 0
    /**
     * One try on replica `index`; on to the next when it is unreachable, `left` more times. A call
     * not safe to repeat (`once`) moves on only when it certainly did nothing there: never
     * received (`Replicas.neverReceived`), or its write refused by a database that only reads
     * (`Replicas.writeRefused`).
     */
    const attempt = <A, E extends { readonly _tag: string }>(
      request: (api: Client.Client) => Effect.Effect<A, E>,
      index: number,
      left: number,
      once: boolean,
      holdMs: number,
      where: StrictJson.InputLocation,
      before: readonly string[] = [],
    ): Fx<A> =>
      request(apis[index]!).pipe(
        Effect.timeout(Duration.millis(timeoutMs + holdMs)),
        Effect.tap(() => Effect.sync(() => void (current = index))),
        Effect.catch((e) => {
          if (Cause.isTimeoutError(e)) options.onHung?.(urls[index]!)
          // A transport failure names every replica this call tried, not only the last.
          const tried = [...before, urls[index]!]
          return left > 0 && (once ? Replicas.neverReceived(e) || Replicas.writeRefused(e) : Replicas.unreachable(e))
            ? attempt(request, (index + 1) % urls.length, left - 1, once, holdMs, where, tried)
            : Cause.isTimeoutError(e)
              ? Effect.fail(new Errors.TransportError(urls[index]!, `no answer within ${timeoutMs + holdMs} ms${once ? " (it may have been done: look before trying again)" : ""}`, { tried, timedOut: true }))
              : Errors.fromFailure(urls[index]!, where)(e).pipe(Effect.mapError((f) => (f instanceof Errors.TransportError ? new Errors.TransportError(f.url, f.reason, { tried }) : f)))
        }),
      )
    const call = <A, E extends { readonly _tag: string }>(request: (api: Client.Client) => Effect.Effect<A, E>, once = false, holdMs = 0): Fx<A> =>
      attempt(request, current, urls.length - 1, once, holdMs, "body")
    /** A call whose input goes in the query (a list's filters, a wait's state): a refusal before sending says `in: "query"`. */
    const ask = <A, E extends { readonly _tag: string }>(request: (api: Client.Client) => Effect.Effect<A, E>, holdMs = 0): Fx<A> =>
      attempt(request, current, urls.length - 1, false, holdMs, "query")
    const byId = (id: string) => ({ params: { id } })

    const sessions: EngramClientShape["sessions"] = {
      // A create without an id gets one chosen here (a UUID, as the coordinator would choose), so
      // every create is safe to repeat on the next replica: a replica that placed it before its
      // answer was lost (a store call timed out, it froze) answers the same id as a repeat.
      create: (input) => {
        const payload = defined({ ...input, id: input.id ?? newId() })
        return call((api) => api.sessions.create({ payload })).pipe(Effect.map(tagged))
      },
      get: (id) => call((api) => api.sessions.get(byId(id))),
      list: (q = {}) => ask((api) => api.sessions.list({ query: defined(q) })),
      listAll: (q = {}) => Page.collect((cursor) => sessions.list({ ...q, cursor })),
      // An idle or resume whose answer was lost has happened: repeated, it is a 409 (the session
      // is no longer in the state it leaves). Sent once, as a move is.
      idle: (id) => call((api) => api.sessions.idle(byId(id)), true),
      resume: (id) => call((api) => api.sessions.resume(byId(id)), true).pipe(Effect.map(tagged)),
      end: (id) => call((api) => api.sessions.end(byId(id))),
      setTtl: (id, ttlMs) => call((api) => api.sessions.ttl({ ...byId(id), payload: { ttlMs } })),
      // A move is begun and then waited for: cut off mid-wait, it may have begun (or committed), and
      // the next replica would begin another. It moves on only from a replica that never received it.
      move: (id, o) => call((api) => api.sessions.move({ ...byId(id), payload: defined(o) }), true, moveHoldMs),
      wait: (id, w) =>
        ask((api) => api.sessions.wait({ ...byId(id), query: { ...defined(w), timeoutMs: w.timeoutMs ?? 30_000 } }), w.timeoutMs ?? 30_000).pipe(
          // A 409 of a wait: the state can no longer be reached.
          Effect.mapError((e) => (e._tag === "Conflict" ? new Errors.Unreachable({ status: e.status, body: e.body }) : e)),
        ),
      events: (id, q = {}) => ask((api) => api.sessions.events({ ...byId(id), query: defined(q) })),
      eventsAll: (id, q = {}) => Page.collect((cursor) => sessions.events(id, { limit: q.limit ?? 1000, cursor })),
    }

    const hosts: EngramClientShape["hosts"] = {
      // A registration answers the host's token once (only its hash is kept): repeated after one
      // that committed, it is a 409 and the token is lost. Sent once; so is a removal (a 404 after).
      create: (input) => call((api) => api.hosts.create({ payload: defined(input) }), true),
      get: (id) => call((api) => api.hosts.get(byId(id))),
      list: (q = {}) => ask((api) => api.hosts.list({ query: defined(q) })),
      listAll: () => Page.collect((cursor) => hosts.list({ cursor })),
      cordon: (id) => call((api) => api.hosts.cordon(byId(id))),
      uncordon: (id) => call((api) => api.hosts.uncordon(byId(id))),
      drain: (id) => call((api) => api.hosts.drain(byId(id))),
      remove: (id) => call((api) => api.hosts.remove(byId(id)), true),
      rotateToken: (id) => call((api) => api.hosts.rotateToken(byId(id))),
      allowances: (id, q = {}) => ask((api) => api.hosts.allowances({ ...byId(id), query: defined(q) })),
    }

    const fleet: EngramClientShape["fleet"] = {
      snapshot: () => call((api) => api.fleet.snapshot()),
      noFit: (b) => ask((api) => api.fleet.noFit({ query: { memMib: b.memMib, vcpus: b.vcpus } })),
    }

    const reservations: EngramClientShape["reservations"] = {
      // A reserve without an id gets one chosen here (as a create does), so it is safe to repeat
      // on the next replica: the ledger refuses a second reservation under one id, and a repeat
      // of one whose answer was lost (a store call timed out, a replica froze) meets that
      // `Conflict`; the reservation under the id is then read, and answered when it is the one
      // asked for (`sameReservation`). Without an id of its own a repeat would hold room twice.
      reserve: (input) => {
        const payload = defined({ ...input, id: input.id ?? newId() })
        return call((api) => api.ledger.reserve({ payload })).pipe(
          Effect.catchTag("Conflict", (e) =>
            e.entity !== "reservation" || e.id !== payload.id
              ? Effect.fail(e)
              : reservations.get(payload.id).pipe(
                  Effect.matchEffect({ onFailure: () => Effect.fail(e), onSuccess: (held) => (sameReservation(held, payload) ? Effect.succeed(held) : Effect.fail(e)) }),
                ),
          ),
        )
      },
      get: (id) => call((api) => api.ledger.get(byId(id))),
      list: (q = {}) => ask((api) => api.ledger.list({ query: defined(q) })),
      listAll: (q = {}) => Page.collect((cursor) => reservations.list({ ...q, cursor })),
      // Repeated after one that committed, a release is a 404: sent once.
      release: (id) => call((api) => api.ledger.release(byId(id)), true),
      heartbeat: (id) => call((api) => api.ledger.heartbeat(byId(id))),
      summary: () => call((api) => api.ledger.summary()),
      metrics: () => call((api) => api.ledger.metrics()),
    }

    const moves: EngramClientShape["moves"] = {
      get: (id) => call((api) => api.moves.get(byId(id))).pipe(Effect.map(withResendOwed)),
      list: (q = {}) => ask((api) => api.moves.list({ query: defined(q) })).pipe(Effect.map((p) => ({ ...p, items: p.items.map(withResendOwed) }))),
      listAll: (q = {}) => Page.collect((cursor) => moves.list({ ...q, cursor })),
      // Repeated after one that committed, a resolve finds the move resolved (a 409): sent once.
      resolve: (id, outcome, reason) => call((api) => api.moves.resolve({ ...byId(id), payload: { outcome, reason } }), true).pipe(Effect.map(withResendOwed)),
    }

    return { baseUrl, sessions, hosts, fleet, reservations, moves, ready: () => call((api) => api.readyz()) }
  })

/** The client as a service. */
export class EngramClient extends Context.Service<EngramClient, EngramClientShape>()("@engram/client/EngramClient") {
  /** The client on the `HttpClient` in context. */
  static readonly layer = (options: Options): Layer.Layer<EngramClient, never, HttpClient.HttpClient> => Layer.effect(EngramClient, make(options))
  /** The client on the platform's `fetch`. */
  static readonly layerFetch = (options: Options): Layer.Layer<EngramClient> => EngramClient.layer(options).pipe(Layer.provide(FetchHttpClient.layer))
}
