/**
 * Placement forwarding (`ENGRAM_PLACEMENT_FORWARD=1`, PostgreSQL): replicas that do not hold
 * the reaper's lease send their creates, in batches, to the replica that does (the placer), as
 * Nomad's servers forward plans to their leader. The placer places them in its own groups, so
 * one replica's groups hold every replica's creates (fleet reads, apply statements and event
 * loop turns shared by more creates); the caller still answers from the replica it called.
 *
 * - **Who places.** The lease holder writes its internal address with every renewal
 *   (`leases.url`); every other replica reads it with its watch of the lease
 *   (`Leadership.leaderUrl`). A leadership change moves the placer with the lease.
 * - **Credential.** `POST /internal/v1/placements` takes the peer token only: an HMAC of the
 *   admin token every replica shares, compared in constant time. It opens nothing else, and
 *   no other token opens it.
 * - **A placer that hangs.** A batch that is not answered within
 *   `ENGRAM_PLACEMENT_FORWARD_TIMEOUT_MS` (Effect's Clock), or fails, is placed here instead, and
 *   this replica places its own creates for a while (`backoffFactor` × the bound) before it tries
 *   again. Every create carries its id (the caller's, or one drawn here before forwarding), and a
 *   create of an id that exists answers the stored session (the store's primary key), so a
 *   create the placer placed late, or placed while this replica fell back, is stored once.
 * - Each create's outcome, or its refusal (`NoRoom`, `Conflict`, `InvalidInput`), comes back as
 *   the placer's store answered it; the caller counts, notifies and answers it as its own.
 */
import { Conflict, InvalidInput, NoRoom, Store } from "@engram/store"
import type { PlaceOutcome, StoreShape } from "@engram/store"
import { StrictJson } from "@engram/api"
import { Context, Deferred, Duration, Effect, Exit, Layer, Option, Redacted, Result } from "effect"
import { HttpRouter, HttpServerResponse } from "effect/http"
import { HttpApiBuilder, HttpApiSecurity } from "effect/http-api"
import type { HttpServerRequest } from "effect/http"
import { createHmac } from "node:crypto"
import { Agent, request } from "node:http"
import { Agent as HttpsAgent, request as httpsRequest } from "node:https"
import { AdminToken, hashToken, sameHash } from "./Auth.js"
import { Leader } from "./Leader.js"
import { Metrics } from "./Metrics.js"
import { Notifier, placedTopics, withNotices } from "./Notifier.js"
import { Settings } from "./Settings.js"

/** A create as the store takes it. */
export type CreateInput = Parameters<StoreShape["createSession"]>[0]
type CreateError = Effect.Error<ReturnType<StoreShape["createSession"]>>

/** The path of the placer's endpoint. */
export const placementsPath = "/internal/v1/placements"

/** At most this many creates per forwarded batch (the endpoint refuses more). */
export const maxForwardBatch = 512

/** At most this many batches in flight from one replica: while they are out, creates gather for the next. */
const maxInFlight = 2

/** After a batch timed out or failed, this replica places its own creates for this many bounds before forwarding again. */
const backoffFactor = 5

/** The credential replicas present to each other: derived from the admin token they share, never the admin token itself. */
export const peerToken = (adminToken: string): string => createHmac("sha256", adminToken).update("engram placement forward v1").digest("base64url")

/** What the placer answers for one create. */
type Answer =
  | { readonly placed: PlaceOutcome }
  | { readonly refused: { readonly _tag: "NoRoom" | "Conflict" | "InvalidInput"; readonly [k: string]: unknown } }
  | { readonly unavailable: string }

const encodeError = (e: unknown): Answer => {
  if (e instanceof NoRoom) return { refused: { _tag: "NoRoom", sessionId: e.sessionId, noFit: e.noFit, tooBig: e.tooBig } }
  if (e instanceof Conflict) return { refused: { _tag: "Conflict", entity: e.entity, id: e.id, reason: e.reason, ...(e.state === undefined ? {} : { state: e.state }) } }
  if (e instanceof InvalidInput) return { refused: { _tag: "InvalidInput", field: e.field, rule: e.rule } }
  return { unavailable: e instanceof Error ? e.message : String(e) }
}

/** A refusal as the placer's store made it, as this replica's store would have. */
const decodeRefusal = (r: Extract<Answer, { refused: unknown }>["refused"]): CreateError => {
  const { _tag, ...fields } = r
  switch (_tag) {
    case "NoRoom":
      return new NoRoom(fields as unknown as ConstructorParameters<typeof NoRoom>[0])
    case "Conflict":
      return new Conflict(fields as unknown as ConstructorParameters<typeof Conflict>[0])
    case "InvalidInput":
      return new InvalidInput(fields as unknown as ConstructorParameters<typeof InvalidInput>[0])
  }
}

export interface ForwarderShape {
  /** Places a create: through the placer when this replica forwards and knows one, else here. */
  readonly create: (input: CreateInput) => Effect.Effect<PlaceOutcome, CreateError>
}

interface Pending {
  readonly input: CreateInput
  readonly answer: Deferred.Deferred<Answer | null>
}

/** POSTs `body` to `url` over a kept-alive connection; the answer's JSON, or an error. Ends the request when `signal` aborts. */
const post = (agents: { readonly http: Agent; readonly https: HttpsAgent }, url: string, token: string, body: string, signal: AbortSignal): Promise<unknown> =>
  new Promise((resolve, reject) => {
    const target = new URL(url)
    const send = target.protocol === "https:" ? httpsRequest : request
    const req = send(
      target,
      {
        method: "POST",
        agent: target.protocol === "https:" ? agents.https : agents.http,
        signal,
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json", "content-length": Buffer.byteLength(body) },
      },
      (res) => {
        const chunks: Buffer[] = []
        res.on("data", (c: Buffer) => chunks.push(c))
        res.on("error", reject)
        res.on("end", () => {
          if (res.statusCode !== 200) return reject(new Error(`the placer answered ${res.statusCode}: ${Buffer.concat(chunks).toString("utf8").slice(0, 200)}`))
          try {
            resolve(JSON.parse(Buffer.concat(chunks).toString("utf8")))
          } catch (e) {
            reject(e instanceof Error ? e : new Error(String(e)))
          }
        })
      },
    )
    req.on("error", reject)
    req.end(body)
  })

export class Forwarder extends Context.Service<Forwarder, ForwarderShape>()("@engram/coordinator/Forwarder") {
  static readonly layer: Layer.Layer<Forwarder, never, Store | Leader | Metrics | Settings | AdminToken> = Layer.effect(
    Forwarder,
    Effect.gen(function* () {
      const store = yield* Store
      const leader = yield* Leader
      const metrics = yield* Metrics
      const { config, backend } = yield* Settings
      const admin = yield* AdminToken
      const local = (input: CreateInput) => store.createSession(input)
      if (config.placementForward !== 1 || backend !== "postgres" || leader.leaderUrl === undefined) return Forwarder.of({ create: local })
      const leaderUrl = leader.leaderUrl
      const token = peerToken(admin.token)
      const boundMs = config.placementForwardTimeoutMs
      const agents = { http: new Agent({ keepAlive: true, maxSockets: maxInFlight * 2 }), https: new HttpsAgent({ keepAlive: true, maxSockets: maxInFlight * 2 }) }
      yield* Effect.addFinalizer(() =>
        Effect.sync(() => {
          agents.http.destroy()
          agents.https.destroy()
        }),
      )

      /** Where creates go now: the placer's address, or null (this replica places). */
      let localUntil = 0
      const placerNow = (now: number): string | null => (leader.isLeader() || now < localUntil ? null : leaderUrl())

      /** Why the last batch failed (logged with the fallback it causes). */
      let lastFailure = ""
      let pending: Pending[] = []
      let inFlight = 0
      let scheduled = false
      const settle = (batch: readonly Pending[], answers: readonly (Answer | null)[]) => {
        batch.forEach((p, i) => Deferred.doneUnsafe(p.answer, Exit.succeed(answers[i] ?? null)))
      }
      const flush = () => {
        scheduled = false
        // A create whose caller gave up (it timed out, and was placed here) is not sent.
        pending = pending.filter((p) => !Deferred.isDoneUnsafe(p.answer))
        while (inFlight < maxInFlight && pending.length > 0) {
          const batch = pending.slice(0, maxForwardBatch)
          pending = pending.slice(batch.length)
          const url = leaderUrl()
          if (url === null) {
            settle(batch, [])
            continue
          }
          inFlight++
          const abort = new AbortController()
          // The request's own bound: a placer that hangs does not hold a connection for ever.
          const timer = setTimeout(() => abort.abort(), boundMs)
          post(agents, `${url}${placementsPath}`, token, JSON.stringify({ creates: batch.map((p) => p.input) }), abort.signal)
            .then(
              (body) => {
                const answers = (body as { answers?: unknown }).answers
                settle(batch, Array.isArray(answers) && answers.length === batch.length ? (answers as Answer[]) : [])
              },
              (e: unknown) => {
                lastFailure = e instanceof Error ? e.message : String(e)
                settle(batch, [])
              },
            )
            .finally(() => {
              clearTimeout(timer)
              inFlight--
              if (pending.length > 0) schedule()
            })
        }
      }
      const schedule = () => {
        if (scheduled) return
        scheduled = true
        // What arrives in this turn of the event loop goes in the same batch.
        setImmediate(flush)
      }

      const fallback = (input: CreateInput, reason: "timeout" | "error") =>
        Effect.gen(function* () {
          metrics.forwardFallbacks.inc({ reason })
          const now = yield* Effect.clockWith((c) => c.currentTimeMillis)
          // Said once per backoff, not once per create.
          if (now >= localUntil)
            yield* Effect.logWarning("forwarded creates are placed here: the placer did not answer", {
              reason,
              boundMs,
              failure: reason === "timeout" ? `no answer within ${boundMs} ms` : lastFailure,
              placesHereForMs: backoffFactor * boundMs,
            })
          localUntil = now + backoffFactor * boundMs
          return yield* local(input)
        })

      const create = (input: CreateInput): Effect.Effect<PlaceOutcome, CreateError> =>
        Effect.gen(function* () {
          const now = yield* Effect.clockWith((c) => c.currentTimeMillis)
          // A create that asked to be refused is placed here: refused here after a forward timed
          // out, the placer could still place it later (room freed meanwhile), and the client
          // would hold a refusal for a session that runs.
          if (input.onNoRoom === "refuse" || placerNow(now) === null) return yield* local(input)
          const answer = Deferred.makeUnsafe<Answer | null>()
          pending.push({ input, answer })
          if (inFlight < maxInFlight) schedule()
          const got = yield* Deferred.await(answer).pipe(
            Effect.timeoutOption(Duration.millis(boundMs)),
            // Given up (or the caller left): a batch not sent yet leaves this create out.
            Effect.onInterrupt(() => Effect.sync(() => Deferred.doneUnsafe(answer, Exit.succeed(null)))),
          )
          if (Option.isNone(got)) {
            Deferred.doneUnsafe(answer, Exit.succeed(null))
            return yield* fallback(input, "timeout")
          }
          const a = got.value
          if (a === null || "unavailable" in a) {
            if (a !== null) lastFailure = a.unavailable
            return yield* fallback(input, "error")
          }
          metrics.forwarded.inc()
          if ("refused" in a) return yield* Effect.fail(decodeRefusal(a.refused))
          return a.placed
        })
      return Forwarder.of({ create })
    }),
  )
}

const json = (status: number, body: Record<string, unknown>) => HttpServerResponse.jsonUnsafe(body, { status, headers: { "cache-control": "no-store" } })
/** The bearer token of the request as the API reads it (its own decoder: `Bearer` in any case, then spaces; never trimmed), or "". */
const bearer = Effect.map(HttpApiBuilder.securityDecode(HttpApiSecurity.bearer), Redacted.value)

/** The keys a forwarded create may have (the store's create input), and its budget's. */
const noQuery: ReadonlySet<string> = new Set()
const createKeys = new Set(["id", "budget", "affinity", "onNoRoom", "idleTimeoutMs", "ttlMs", "template"])
const budgetKeys = new Set(["memMib", "vcpus"])
const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v)

/** Why a forwarded batch's body is refused, or null. The store checks each create's values itself. */
const badBatch = (body: unknown): string | null => {
  if (!isObject(body) || !Array.isArray(body["creates"]) || Object.keys(body).length !== 1) return "creates: the body must be {creates: [...]}"
  const creates = body["creates"] as unknown[]
  if (creates.length < 1 || creates.length > maxForwardBatch) return `creates: must hold 1 to ${maxForwardBatch} creates`
  const i = creates.findIndex(
    (c) =>
      !isObject(c) ||
      typeof c["id"] !== "string" ||
      !isObject(c["budget"]) ||
      Object.keys(c).some((k) => !createKeys.has(k)) ||
      Object.keys(c["budget"]).some((k) => !budgetKeys.has(k)),
  )
  return i === -1 ? null : `creates[${i}]: must be a create (a string id, a budget of memMib and vcpus, and only the create's keys)`
}

/**
 * The placer's endpoint: places every create of a batch from another replica (together, so they
 * share its groups) and answers each. Only the peer token opens it.
 */
export const PeerLive: Layer.Layer<never, never, HttpRouter.HttpRouter | Store | AdminToken | Metrics | Notifier> = Layer.unwrap(
  Effect.gen(function* () {
    const leader = yield* Effect.serviceOption(Leader)
    const store = yield* Store
    const notifier = yield* Notifier
    const admin = yield* AdminToken
    const metrics = yield* Metrics
    const peerHash = hashToken(peerToken(admin.token))
    const handler = (r: HttpServerRequest.HttpServerRequest) =>
      Effect.gen(function* () {
        const token = yield* bearer
        if (token === "" || !sameHash(hashToken(token), peerHash)) return json(401, { error: "Unauthorized", message: "this endpoint takes the replicas' peer token only" })
        // The API's input rules (`StrictJson`): no query parameter; a body of UTF-8 JSON, no key given twice.
        const stray = StrictJson.queryProblem(r.url, noQuery)
        if (stray !== undefined) return json(400, { error: "InvalidInput", ...stray, message: `${stray.field}: ${stray.rule}` })
        const bytes = yield* Effect.option(r.arrayBuffer)
        const parsed = Option.isNone(bytes) ? Result.fail({ field: "body", rule: "must be JSON", in: "body" as const }) : StrictJson.parseBody(bytes.value)
        if (Result.isFailure(parsed)) return json(400, { error: "InvalidInput", ...parsed.failure, message: `${parsed.failure.field}: ${parsed.failure.rule}` })
        const body = { value: parsed.success }
        const bad = badBatch(body.value)
        if (bad !== null) return json(400, { error: "InvalidInput", field: "creates", rule: bad, message: bad })
        // Only the leader places for the others: a batch sent to a stale or wrong address (an old
        // leader, a loopback address advertised to another machine) is refused, and its sender
        // places it itself.
        if (Option.isSome(leader) && !leader.value.isLeader())
          return json(409, { error: "NotLeader", message: "this replica does not hold the lease: it places no creates for others" })
        const creates = (body.value as unknown as { creates: CreateInput[] }).creates
        const answers = yield* Effect.forEach(
          creates,
          (c) =>
            // Announced here as well as by the sender (it notifies on the answer): a sender that
            // gave up on this batch (its bound passed) and then failed to place the create itself
            // would leave a create committed here unannounced (`withNotices`).
            withNotices(
              store.createSession(c).pipe(
                Effect.tap((o) => notifier.notify(...placedTopics(o))),
              ),
            ).pipe(
              Effect.map((placed): Answer => ({ placed })),
              Effect.catch((e) => Effect.succeed(encodeError(e))),
            ),
          { concurrency: "unbounded" },
        )
        metrics.placedForPeers.inc(answers.filter((a) => !("unavailable" in a)).length)
        return json(200, { answers })
      })
    return HttpRouter.add("POST", placementsPath, handler)
  }),
)
