/**
 * The Effect-native client: `EngramClient`, a service of every call by resource
 * (`sessions`, `hosts`, `fleet`, `reservations`, `moves`), each an `Effect` that fails with
 * one of `Errors`' classes (`Effect.catchTag("NotFound", …)`). `EngramClient.layer(options)`
 * needs an `HttpClient`; `EngramClient.layerFetch(options)` brings the platform's `fetch`.
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
import { Records as ApiRecords } from "@engram/api"
import type { Payloads } from "@engram/api"
import { Context, Effect, Layer, Redacted, Schema } from "effect"
import { FetchHttpClient, HttpClient } from "effect/http"
import * as Errors from "./Errors.js"
import * as Transport from "./internal/Transport.js"
import * as Page from "./Page.js"
import * as Records from "./Records.js"

/** Where the coordinator is and the token to call it with. */
export interface Options {
  /** The coordinator's URL, e.g. `http://127.0.0.1:7070`. */
  readonly baseUrl: string | URL
  /** The admin token (or a host's own token, which acts for its own host only). */
  readonly token: string | Redacted.Redacted<string>
}

/** `sessions.create`'s input. */
export interface CreateSession {
  /** Your id for the session (1–100 of `A–Z a–z 0–9 . _ -`); a UUID when omitted. A repeated id answers the existing session. */
  readonly id?: string | undefined
  readonly memMib: number
  readonly vcpus: number
  /** Hosts to prefer, in order. */
  readonly affinity?: readonly string[] | undefined
  /** When nothing fits: wait in the queue (default) or fail with `NoRoom`. */
  readonly onNoRoom?: "queue" | "refuse" | undefined
}

/** `sessions.list`'s filter. */
export interface SessionsQuery extends Page.PageQuery {
  readonly state?: Records.SessionState | undefined
  readonly hostId?: string | undefined
}

/** `sessions.wait`'s target. */
export interface WaitFor {
  readonly state: Records.SessionState
  /** How long the coordinator holds the request (it may cap it); default 30 s. */
  readonly timeoutMs?: number | undefined
}

/** `sessions.move`'s budget and target. */
export interface MoveOptions {
  readonly maxDowntimeMs: number
  /** Default: the best-ranked host other than the source. */
  readonly targetHostId?: string | undefined
}

/** `moves.list`'s filter. */
export interface MovesQuery extends Page.PageQuery {
  readonly hostId?: string | undefined
  readonly state?: Records.MoveState | undefined
}

/** `reservations.list`'s filter. */
export interface ReservationsQuery extends Page.PageQuery {
  readonly hostId?: string | undefined
}

type Fx<A> = Effect.Effect<A, Errors.ClientError>

/** Every call, by resource. */
export interface EngramClientShape {
  readonly baseUrl: string
  readonly sessions: {
    /** Places a session, or queues it (`outcome: "queued"` with its position and each host's reason). */
    readonly create: (input: CreateSession) => Fx<Records.PlaceAnswer>
    /** One session; a queued one carries `queue` (position, reasons) where the coordinator sends it. */
    readonly get: (id: string) => Fx<Records.Session>
    /** One page of sessions, oldest first. */
    readonly list: (query?: SessionsQuery) => Fx<Page.Page<Records.Session>>
    /** Every session of the filter, page after page. */
    readonly listAll: (query?: Omit<SessionsQuery, "cursor">) => Fx<readonly Records.Session[]>
    /** A running session went idle: the park gate parks it (paused in RAM) or descends it. */
    readonly idle: (id: string) => Fx<{ readonly id: string; readonly state: Records.SessionState }>
    /** Parked → running on the same host (`resumed: "warm"`), or descended → restored (`"cold"`, placed or queued). */
    readonly resume: (id: string) => Fx<Records.PlaceAnswer>
    /** Ends a session from any state; its room is released. */
    readonly end: (id: string) => Fx<Records.Session>
    /** Moves a running session live within `maxDowntimeMs`; fails with `MoveDowntime` (and the estimate) when the guard refuses. */
    readonly move: (id: string, options: MoveOptions) => Fx<Records.MoveCommitted>
    /** Waits until the session is in `state`: `WaitTimeout` when time runs out, `Unreachable` when it can no longer get there. */
    readonly wait: (id: string, target: WaitFor) => Fx<Records.Session>
    /** One page of the session's history, oldest first. */
    readonly events: (id: string, query?: Page.PageQuery) => Fx<Page.Page<Records.SessionEvent>>
  }
  readonly hosts: {
    /** Registers a host; answers its agent's token (shown this once). */
    readonly create: (input: { readonly id: string; readonly labels?: Readonly<Record<string, string>> | undefined }) => Fx<Records.HostCreated>
    readonly get: (id: string) => Fx<Records.Host>
    readonly list: (query?: Page.PageQuery) => Fx<Page.Page<Records.Host>>
    readonly listAll: () => Fx<readonly Records.Host[]>
    readonly cordon: (id: string) => Fx<Records.Host>
    readonly uncordon: (id: string) => Fx<Records.Host>
    readonly drain: (id: string) => Fx<Records.Host>
    /** Removes a host (`Conflict` while it holds reservations). */
    readonly remove: (id: string) => Fx<void>
    /** A new token for the host's agent; the old one stops working. */
    readonly rotateToken: (id: string) => Fx<Records.HostToken>
  }
  readonly fleet: {
    /** The fleet signal: hosts by state, capacity, reserved and free room, the queue, parks, descents. */
    readonly snapshot: () => Fx<Records.Fleet>
    /** Whether a budget would fit now, and each host's reason. */
    readonly noFit: (budget: Records.Budget) => Fx<Records.NoFit>
  }
  readonly reservations: {
    readonly reserve: (input: Payloads.Reserve) => Fx<Records.Reservation>
    readonly get: (id: string) => Fx<Records.Reservation>
    readonly list: (query?: ReservationsQuery) => Fx<Page.Page<Records.Reservation>>
    readonly listAll: (query?: Omit<ReservationsQuery, "cursor">) => Fx<readonly Records.Reservation[]>
    readonly release: (id: string) => Fx<Records.Reservation>
    readonly heartbeat: (id: string) => Fx<Records.Reservation>
    readonly summary: () => Fx<Records.ClusterSummary>
    readonly metrics: () => Fx<Records.LedgerMetrics>
  }
  readonly moves: {
    readonly get: (id: string) => Fx<Records.Move>
    readonly list: (query?: MovesQuery) => Fx<Page.Page<Records.Move>>
    readonly listAll: (query?: Omit<MovesQuery, "cursor">) => Fx<readonly Records.Move[]>
    /** Ends an in-doubt move (SPEC §13): `commit` (the guest runs on the target) or `abort` (on the source). */
    readonly resolve: (id: string, outcome: "commit" | "abort", reason: string) => Fx<Records.Move>
  }
  /** Whether the coordinator serves and its store answers (no token needed). */
  readonly ready: () => Fx<Records.Ready>
}

const SessionPage = Page.schema(Records.Session)
const HostPage = Page.schema(ApiRecords.Host)
const ReservationPage = Page.schema(ApiRecords.Reservation)
const MovePage = Page.schema(ApiRecords.Move)
const EventPage = Page.schema(Records.SessionEvent)
const Idled = Schema.Struct({ id: Schema.String, state: Records.Session.fields.state })

const path = (...parts: readonly string[]) => parts.map((p, i) => (i % 2 === 1 ? encodeURIComponent(p) : p)).join("/")

/** Builds a client on an `HttpClient`. */
export const make = (options: Options): Effect.Effect<EngramClientShape, never, HttpClient.HttpClient> =>
  Effect.gen(function* () {
    const target: Transport.Target = {
      baseUrl: Transport.normalizeBaseUrl(options.baseUrl),
      token: typeof options.token === "string" ? Redacted.make(options.token) : options.token,
    }
    const http = yield* HttpClient.HttpClient
    const api = yield* Transport.apiClient(target)
    const run = <A>(eff: Effect.Effect<A, Errors.ClientError, HttpClient.HttpClient>): Fx<A> => Effect.provideService(eff, HttpClient.HttpClient, http)
    const typed = <A, E>(eff: Effect.Effect<A, E>): Fx<A> => Transport.viaApi(target.baseUrl, eff)
    const json = <S extends Schema.Codec<unknown, unknown>>(schema: S, r: Transport.Request): Fx<S["Type"]> =>
      run(Transport.send(target, r).pipe(Effect.flatMap(Transport.decode(schema))))
    const page = <S extends Schema.Codec<unknown, unknown>, A>(schema: S, r: Transport.Request): Fx<Page.Page<A>> =>
      json(schema, r).pipe(Effect.map((a) => Page.normalize(a as readonly A[] | Page.Page<A>)))

    /** A create's or resume's answer by its status: 201/200 placed (or warm), 202 queued. */
    const placeAnswer = (r: Transport.Request): Fx<Records.PlaceAnswer> =>
      run(
        Transport.send(target, r).pipe(
          Effect.flatMap((a) =>
            a.status === 202
              ? Effect.map(Transport.decode(Records.Queued)(a), (q): Records.PlaceAnswer => ({ outcome: "queued", ...q }))
              : Effect.map(Transport.decode(Records.Placed)(a), (p): Records.PlaceAnswer => ({ outcome: "placed", ...p })),
          ),
        ),
      )

    const sessions: EngramClientShape["sessions"] = {
      create: (input) =>
        placeAnswer({
          method: "POST",
          path: "/v1/sessions",
          body: {
            ...(input.id === undefined ? {} : { id: input.id }),
            memMib: input.memMib,
            vcpus: input.vcpus,
            ...(input.affinity === undefined ? {} : { affinity: input.affinity }),
            ...(input.onNoRoom === undefined ? {} : { onNoRoom: input.onNoRoom }),
          },
        }),
      get: (id) => json(Records.Session, { method: "GET", path: path("/v1/sessions", id) }),
      list: (q = {}) =>
        page(SessionPage, { method: "GET", path: "/v1/sessions", query: { state: q.state, hostId: q.hostId, limit: q.limit, cursor: q.cursor } }),
      listAll: (q = {}) => Page.collect((cursor) => sessions.list({ ...q, cursor })),
      idle: (id) => json(Idled, { method: "POST", path: `${path("/v1/sessions", id)}/idle` }),
      resume: (id) => placeAnswer({ method: "POST", path: `${path("/v1/sessions", id)}/resume` }),
      end: (id) => typed(api.sessions.end({ params: { id } })),
      move: (id, o) =>
        typed(api.sessions.move({ params: { id }, payload: o.targetHostId === undefined ? { maxDowntimeMs: o.maxDowntimeMs } : { maxDowntimeMs: o.maxDowntimeMs, targetHostId: o.targetHostId } })),
      wait: (id, w) =>
        json(Records.Session, { method: "GET", path: `${path("/v1/sessions", id)}/wait`, query: { state: w.state, timeoutMs: w.timeoutMs ?? 30_000 } }).pipe(
          // A 409 of a wait: the state can no longer be reached.
          Effect.mapError((e) => (e._tag === "Conflict" ? new Errors.Unreachable({ status: e.status, body: e.body }) : e)),
        ),
      events: (id, q = {}) => page(EventPage, { method: "GET", path: `${path("/v1/sessions", id)}/events`, query: { limit: q.limit, cursor: q.cursor } }),
    }

    const hosts: EngramClientShape["hosts"] = {
      create: (input) => typed(api.hosts.create({ payload: input.labels === undefined ? { id: input.id } : { id: input.id, labels: { ...input.labels } } })),
      get: (id) => typed(api.hosts.get({ params: { id } })),
      list: (q = {}) => page(HostPage, { method: "GET", path: "/v1/hosts", query: { limit: q.limit, cursor: q.cursor } }),
      listAll: () => Page.collect((cursor) => hosts.list({ cursor })),
      cordon: (id) => typed(api.hosts.cordon({ params: { id } })),
      uncordon: (id) => typed(api.hosts.uncordon({ params: { id } })),
      drain: (id) => typed(api.hosts.drain({ params: { id } })),
      remove: (id) => run(Transport.send(target, { method: "DELETE", path: path("/v1/hosts", id) }).pipe(Effect.asVoid)),
      rotateToken: (id) => json(Records.HostToken, { method: "POST", path: `${path("/v1/hosts", id)}/token` }),
    }

    const fleet: EngramClientShape["fleet"] = {
      snapshot: () => json(Records.Fleet, { method: "GET", path: "/v1/fleet" }),
      noFit: (b) => typed(api.fleet.noFit({ query: { memMib: b.memMib, vcpus: b.vcpus } })),
    }

    const reservations: EngramClientShape["reservations"] = {
      reserve: (input) => typed(api.ledger.reserve({ payload: input })),
      get: (id) => typed(api.ledger.get({ params: { id } })),
      list: (q = {}) => page(ReservationPage, { method: "GET", path: "/v1/reservations", query: { hostId: q.hostId, limit: q.limit, cursor: q.cursor } }),
      listAll: (q = {}) => Page.collect((cursor) => reservations.list({ ...q, cursor })),
      release: (id) => typed(api.ledger.release({ params: { id } })),
      heartbeat: (id) => typed(api.ledger.heartbeat({ params: { id } })),
      summary: () => typed(api.ledger.summary()),
      metrics: () => typed(api.ledger.metrics()),
    }

    const moves: EngramClientShape["moves"] = {
      get: (id) => typed(api.moves.get({ params: { id } })),
      list: (q = {}) => page(MovePage, { method: "GET", path: "/v1/moves", query: { hostId: q.hostId, state: q.state, limit: q.limit, cursor: q.cursor } }),
      listAll: (q = {}) => Page.collect((cursor) => moves.list({ ...q, cursor })),
      resolve: (id, outcome, reason) => typed(api.moves.resolve({ params: { id }, payload: { outcome, reason } })),
    }

    return { baseUrl: target.baseUrl, sessions, hosts, fleet, reservations, moves, ready: () => typed(api.readyz()) }
  })

/** The client as a service. */
export class EngramClient extends Context.Service<EngramClient, EngramClientShape>()("@engram/client/EngramClient") {
  /** The client on the `HttpClient` in context. */
  static readonly layer = (options: Options): Layer.Layer<EngramClient, never, HttpClient.HttpClient> => Layer.effect(EngramClient, make(options))
  /** The client on the platform's `fetch`. */
  static readonly layerFetch = (options: Options): Layer.Layer<EngramClient> => EngramClient.layer(options).pipe(Layer.provide(FetchHttpClient.layer))
}
