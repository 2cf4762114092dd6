/**
 * The dashboard's routes on a coordinator's router: the page and its assets under `/ui`
 * (static files, no data, served without a token), and `/ui/changes`, a long-poll that
 * answers as soon as the fleet changes, so the page refetches from the API only then. The
 * page reads everything it shows from the API with the token the user signed in with; the
 * long-poll needs that token too and answers only a version string.
 */
import { Effect, Layer } from "effect"
import { HttpRouter, HttpServerResponse } from "effect/http"
import type { HttpServerRequest } from "effect/http"
import { existsSync, readFileSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

/** What the coordinator gives the dashboard. */
export interface Options {
  /** Whether a bearer token may read the fleet (the admin token). A failure answers 503. */
  readonly authorize: (token: string) => Effect.Effect<boolean, unknown>
  /** A short string that changes whenever something the page shows changes (hosts, queue, parks, descents, moves). */
  readonly version: Effect.Effect<string, unknown>
  /** How often a waiting `/ui/changes` re-reads the version (default 500 ms). */
  readonly pollMs?: number | undefined
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

const json = (status: number, body: Record<string, unknown>) => HttpServerResponse.jsonUnsafe(body, { status, headers: { "cache-control": "no-store" } })

/** The bearer token of a request, or "". */
const bearer = (request: HttpServerRequest.HttpServerRequest): string => /^Bearer\s+(.+)$/i.exec(request.headers["authorization"] ?? "")?.[1]?.trim() ?? ""

/** The dashboard's routes (add to the coordinator's served layers). */
export const layer = (options: Options): Layer.Layer<never, never, HttpRouter.HttpRouter> => {
  const dir = assetDir()
  const page = asset(dir, "index.html")
  const script = asset(dir, "app.js")
  const style = asset(dir, "style.css")
  const pollMs = options.pollMs ?? 500

  const changes = (request: HttpServerRequest.HttpServerRequest) =>
    Effect.gen(function* () {
      const token = bearer(request)
      if (token === "") return json(401, { error: "Unauthorized", message: "missing bearer token" })
      if (!(yield* options.authorize(token))) return json(401, { error: "Unauthorized", message: "the dashboard needs the admin token" })
      const url = new URL(request.url, "http://localhost")
      const since = url.searchParams.get("since") ?? ""
      const waitMs = Math.min(maxWaitMs, Math.max(0, Number(url.searchParams.get("waitMs") ?? "0") || 0))
      let version = yield* options.version
      const deadline = Date.now() + waitMs
      while (version === since && Date.now() < deadline) {
        yield* Effect.sleep(Math.min(pollMs, Math.max(0, deadline - Date.now())))
        version = yield* options.version
      }
      return json(200, { version })
    }).pipe(Effect.catchCause(() => Effect.succeed(json(503, { error: "Unavailable", message: "the fleet could not be read; retry", retryAfterMs: 1000 }))))

  return Layer.mergeAll(
    // The root has nothing else to show a browser: send it to the dashboard.
    HttpRouter.add("GET", "/", HttpServerResponse.redirect("/ui", { status: 302 })),
    HttpRouter.add("GET", "/ui", file(page, "text/html; charset=utf-8")),
    HttpRouter.add("GET", "/ui/app.js", file(script, "text/javascript; charset=utf-8")),
    HttpRouter.add("GET", "/ui/style.css", file(style, "text/css; charset=utf-8")),
    HttpRouter.add("GET", "/ui/changes", changes),
  )
}
