/**
 * Who may call what. Every endpoint but the liveness, readiness and documentation ones needs
 * `Authorization: Bearer <token>`: the admin token, or a host agent's own token (which acts for
 * its own host only). `/metrics` also takes a separate scrape token. The middlewares are
 * declared here and implemented by the coordinator; `AdminOnly` sits on every admin operation,
 * so no handler checks it again.
 */
import { Context } from "effect"
import { HttpApiMiddleware, HttpApiSecurity } from "effect/http-api"
import { BadRequest, Forbidden, ServiceUnavailableResponse, Unauthorized } from "./Errors.js"

/** Who made the request: the admin, or a host agent acting for its own host. */
export type Principal = { readonly _tag: "Admin" } | { readonly _tag: "Host"; readonly hostId: string }

/** The authenticated caller of the current request. */
export class CurrentPrincipal extends Context.Service<CurrentPrincipal, Principal>()("@engram/api/CurrentPrincipal") {}

/** `Authorization: Bearer <token>`: the admin token or a host's own token; anything else is 401. */
export class BearerAuth extends HttpApiMiddleware.Service<BearerAuth, { provides: CurrentPrincipal }>()("@engram/api/BearerAuth", {
  security: { bearer: HttpApiSecurity.bearer },
  error: [Unauthorized, ServiceUnavailableResponse],
  requiredForClient: true,
}) {}

/** Admin operations: a host token gets 403. Runs after `BearerAuth`. */
export class AdminOnly extends HttpApiMiddleware.Service<AdminOnly, { requires: CurrentPrincipal }>()("@engram/api/AdminOnly", {
  error: Forbidden,
}) {}

/** `GET /metrics`: the scrape token (`ENGRAM_METRICS_TOKEN`), the admin token or a host token. */
export class ScrapeAuth extends HttpApiMiddleware.Service<ScrapeAuth>()("@engram/api/ScrapeAuth", {
  security: { bearer: HttpApiSecurity.bearer },
  error: [Unauthorized, ServiceUnavailableResponse],
  requiredForClient: true,
}) {}

/** Request decode failures as `400 {error, field, rule, in}`. */
export class InputErrors extends HttpApiMiddleware.Service<InputErrors>()("@engram/api/InputErrors", {
  error: BadRequest,
}) {}

/**
 * What the schemas cannot say: an endpoint that declares no query takes no query parameter, one
 * that declares no body takes none (nothing, or `{}`), and a body is valid UTF-8 (a decoder
 * would store U+FFFD for the bytes it cannot read). Refused with `400 {error, field, rule, in}`.
 * Runs after the credential checks, as the schema decoding does, so a caller that may not call
 * an endpoint learns nothing about its input rules.
 */
export class StrictInput extends HttpApiMiddleware.Service<StrictInput>()("@engram/api/StrictInput", {
  error: BadRequest,
}) {}
