/**
 * The dashboard's routes on a coordinator's router: the page and its assets under `/ui`
 * (static files, no data, served without a token); `/ui/changes`, a long-poll that answers as
 * soon as the fleet changes, so the page refetches from the API only then; and `/ui/history`,
 * the coordinator's recent samples of the fleet signal for the page's small charts. The page
 * reads everything else from the API with the token the user signed in with; both routes need
 * that token too. Their input follows the API's rules (`@engram/api`'s `StrictJson`).
 */
import { StrictJson } from "@engram/api"
import { Names } from "@engram/core"
import { Clock, Effect, Layer, Redacted } from "effect"
import type { Scope } from "effect"
import { HttpRouter, HttpServerResponse } from "effect/http"
import type { HttpServerRequest } from "effect/http"
import { HttpApiBuilder, HttpApiSecurity } from "effect/http-api"
import { existsSync, readdirSync, readFileSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

/** One sample of the fleet signal over time (free RAM, the queue, parks, descents), at epoch ms `at`. */
export interface HistorySample {
  readonly at: number
  readonly freeMib: number
  readonly capacityMib: number
  readonly queue: number
  readonly withoutRoom: number
  readonly parks: number
  readonly descents: number
}

/** The samples the coordinator kept, oldest first, and how far apart they are taken. */
export interface History {
  readonly intervalMs: number
  readonly samples: readonly HistorySample[]
}

/** What the coordinator gives the dashboard. */
export interface Options {
  /** Whether a bearer token may read the fleet (the admin token). A failure answers 503. */
  readonly authorize: (token: string) => Effect.Effect<boolean, unknown>
  /** A short string that changes whenever something the page shows changes (hosts, queue, parks, descents, moves). */
  readonly version: Effect.Effect<string, unknown>
  /** The fleet signal over time, for the charts; without it the page draws none. */
  readonly history?: Effect.Effect<History, unknown> | undefined
  /**
   * How often a waiting `/ui/changes` re-reads the version (default 500 ms); with `watch`, the
   * least time between two of its reads.
   */
  readonly pollMs?: number | undefined
  /**
   * Opens a watch on the fleet for the request's lifetime; its `next(ms)` waits until something
   * may have changed since the watch opened or since the last `next` (true), or `ms` passes
   * (false). With it, a waiting `/ui/changes` reads the version only after a change, not every
   * `pollMs`.
   */
  readonly watch?: Effect.Effect<{ readonly next: (timeoutMs: number) => Effect.Effect<boolean> }, never, Scope.Scope> | undefined
  /**
   * Runs each `/ui/changes` once its token and query are checked (its watch, its reads and its
   * wait), under the app's rules for long-polls: a cap on how many are open at once (the app
   * answers beyond it, e.g. a 429) and its shutdown (the app ends the `watch` opened inside: the
   * request answers the version at once, as at its deadline). Without it, as it is.
   */
  readonly longPoll?: (<E>(poll: Effect.Effect<HttpServerResponse.HttpServerResponse, E>) => Effect.Effect<HttpServerResponse.HttpServerResponse, E>) | undefined
}

/** The longest `/ui/changes` waits before it answers the same version. */
export const maxWaitMs = 25_000

/**
 * Where the page's files are: `assets/` beside this module's `src/` or `dist/`, or, when this
 * module is bundled into an app's `dist/main.js`, the installed package's.
 */
const assetDir = (): string => {
  const beside = fileURLToPath(new URL("../assets/", import.meta.url))
  if (existsSync(join(beside, "index.html"))) return beside
  return join(dirname(createRequire(import.meta.url).resolve("@engram/dashboard/package.json")), "assets")
}

/** One of the page's files, read once. */
const asset = (dir: string, name: string): string => readFileSync(join(dir, name), "utf8")

/** Files only from this origin; the page runs no inline code. */
const securityHeaders = {
  "content-security-policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "cache-control": "no-cache",
}

const file = (body: string, contentType: string) => HttpServerResponse.text(body, { contentType, headers: securityHeaders })

const changesParams: ReadonlySet<string> = new Set(["since", "waitMs"])
const noParams: ReadonlySet<string> = new Set()

/**
 * `/ui/changes`' query: `since` (a version, any text) and `waitMs` (decimal digits, 0 to
 * {@link maxWaitMs}; default 0), each at most once and nothing else; or the refusal's field and rule.
 */
export const changesQuery = (params: URLSearchParams): { readonly since: string; readonly waitMs: number } | { readonly field: string; readonly rule: string } => {
  const stray = StrictJson.paramsProblem(params, changesParams)
  if (stray !== undefined) return { field: stray.field, rule: stray.rule }
  const wait = params.get("waitMs")
  if (wait !== null && (!Names.decimalInt.test(wait) || Number(wait) < 0 || Number(wait) > maxWaitMs)) return { field: "waitMs", rule: `must be an integer from 0 to ${maxWaitMs}` }
  return { since: params.get("since") ?? "", waitMs: wait === null ? 0 : Number(wait) }
}

const json = (status: number, body: Record<string, unknown>) => HttpServerResponse.jsonUnsafe(body, { status, headers: { "cache-control": "no-store" } })

/** The bearer token of the request as the API reads it (its own decoder: `Bearer` in any case, then spaces; never trimmed), or "". */
const bearer = Effect.map(HttpApiBuilder.securityDecode(HttpApiSecurity.bearer), Redacted.value)

/** A body sent to a route that takes none: its refusal's field and rule, or null. */
const strayBody = (request: HttpServerRequest.HttpServerRequest): { readonly field: string; readonly rule: string; readonly in: "body" } | null =>
  StrictJson.declaresBody(request.headers) ? { field: "body", rule: StrictJson.noBodyRule, in: "body" } : null

/** `/ui/history` takes no query parameter: the first one's refusal, or null. */
export const historyQuery = (params: URLSearchParams): { readonly field: string; readonly rule: string } | null => {
  const stray = StrictJson.paramsProblem(params, noParams)
  return stray === undefined ? null : { field: stray.field, rule: stray.rule }
}

/** The dashboard's routes (add to the coordinator's served layers). */
export const layer = (options: Options): Layer.Layer<never, never, HttpRouter.HttpRouter> => {
  const dir = assetDir()
  const page = asset(dir, "index.html")
  const style = asset(dir, "style.css")
  // The page's modules (app.js imports the others), each at /ui/<name>.js.
  const scripts = readdirSync(dir)
    .filter((f) => f.endsWith(".js"))
    .map((f) => [f, asset(dir, f)] as const)
  const pollMs = options.pollMs ?? 500

  /** Null for the admin's request, else the 401 that refuses it. */
  const refusal = Effect.gen(function* () {
    const token = yield* bearer
    if (token === "") return json(401, { error: "Unauthorized", message: "missing bearer token" })
    if (!(yield* options.authorize(token))) return json(401, { error: "Unauthorized", message: "the dashboard needs the admin token" })
    return null
  })

  const unavailable = () => Effect.succeed(json(503, { error: "Unavailable", message: "the fleet could not be read; retry", retryAfterMs: 1000 }))

  const history = (request: HttpServerRequest.HttpServerRequest) =>
    Effect.gen(function* () {
      const refused = yield* refusal
      if (refused !== null) return refused
      // As the API's `StrictInput`, after the credential: no query parameter, no body.
      const query = historyQuery(new URL(request.url, "http://localhost").searchParams)
      if (query !== null) return json(400, { error: "InvalidInput", ...query, in: "query" })
      const body = strayBody(request)
      if (body !== null) return json(400, { error: "InvalidInput", ...body })
      const h = options.history === undefined ? { intervalMs: 0, samples: [] } : yield* options.history
      return json(200, { intervalMs: h.intervalMs, samples: h.samples })
    }).pipe(Effect.catchCause(unavailable))

  /** The version once it differs from `since`, or `waitMs` passed (or the app's `watch` was ended). */
  const poll = (since: string, waitMs: number) =>
    Effect.gen(function* () {
      // Watching before the first read: a change made while it runs wakes the wait below.
      const watch = options.watch === undefined ? null : yield* options.watch
      let version = yield* options.version
      let readAt = yield* Clock.currentTimeMillis
      const deadline = readAt + waitMs
      let now = readAt
      while (version === since && now < deadline) {
        // Nothing changed by the deadline: the version read last is the latest.
        if (watch !== null && !(yield* watch.next(Math.max(0, deadline - now)))) break
        // At most one read per pollMs, whatever the rate of changes.
        yield* Effect.sleep(Math.max(0, Math.min(readAt + pollMs, deadline) - (yield* Clock.currentTimeMillis)))
        version = yield* options.version
        readAt = now = yield* Clock.currentTimeMillis
      }
      return json(200, { version })
    }).pipe(Effect.scoped)
  const longPoll = options.longPoll ?? ((p) => p)

  const changes = (request: HttpServerRequest.HttpServerRequest) =>
    Effect.gen(function* () {
      const refused = yield* refusal
      if (refused !== null) return refused
      const query = changesQuery(new URL(request.url, "http://localhost").searchParams)
      if ("field" in query) return json(400, { error: "InvalidInput", ...query, in: "query" })
      const body = strayBody(request)
      if (body !== null) return json(400, { error: "InvalidInput", ...body })
      return yield* longPoll(poll(query.since, query.waitMs))
    }).pipe(Effect.catchCause(unavailable))

  return Layer.mergeAll(
    // The root has nothing else to show a browser: send it to the dashboard.
    HttpRouter.add("GET", "/", HttpServerResponse.redirect("/ui", { status: 302 })),
    HttpRouter.add("GET", "/ui", file(page, "text/html; charset=utf-8")),
    ...scripts.map(([name, body]) => HttpRouter.add("GET", `/ui/${name}`, file(body, "text/javascript; charset=utf-8"))),
    HttpRouter.add("GET", "/ui/style.css", file(style, "text/css; charset=utf-8")),
    HttpRouter.add("GET", "/ui/changes", changes),
    HttpRouter.add("GET", "/ui/history", history),
  )
}

/** The page's files as the coordinator serves them (for route labels): `/ui/<name>`. */
export const assetPaths = (): readonly string[] =>
  readdirSync(assetDir())
    .filter((f) => f.endsWith(".js") || f === "style.css")
    .map((f) => `/ui/${f}`)
