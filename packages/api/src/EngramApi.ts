/**
 * The coordinator's whole HTTP API as one `HttpApi`: the coordinator implements it, clients
 * derive from it (`HttpApiClient.make(EngramApi)`), and `/openapi.json` and `/docs` are
 * generated from it.
 */
import { HttpApi, OpenApi } from "effect/http-api"
import { FleetApi } from "./FleetApi.js"
import { HostsApi } from "./HostsApi.js"
import { LedgerApi } from "./LedgerApi.js"
import { MovesApi } from "./MovesApi.js"
import { OpsApi } from "./OpsApi.js"
import { InputErrors } from "./Security.js"
import { SessionsApi } from "./SessionsApi.js"

/**
 * The HTTP auth scheme names the IANA registry's way (`bearer`): readers of the document compare
 * it as written, and the API reference at `/docs` otherwise offers `Authorization: Basic …` in
 * its request samples. (RFC 9110 makes the scheme case-insensitive on the wire; the coordinator
 * accepts either.)
 */
const bearerSchemeLowercase = (spec: Record<string, unknown>): Record<string, unknown> => {
  const components = spec["components"] as { securitySchemes?: Record<string, { type?: string; scheme?: string }> } | undefined
  const schemes = components?.securitySchemes
  if (schemes === undefined) return spec
  for (const scheme of Object.values(schemes)) {
    if (scheme.type === "http" && typeof scheme.scheme === "string") scheme.scheme = scheme.scheme.toLowerCase()
  }
  return spec
}

/** The API's version in the OpenAPI document. */
export const version = "0.1.0"

/** The engram coordinator's API. */
export class EngramApi extends HttpApi.make("engram")
  .add(OpsApi)
  .add(HostsApi)
  .add(SessionsApi)
  .add(MovesApi)
  .add(FleetApi)
  .add(LedgerApi)
  .middleware(InputErrors)
  .annotate(HttpApi.PayloadParseOptions, { onExcessProperty: "error" })
  .annotate(HttpApi.QueryParseOptions, { onExcessProperty: "error" })
  .annotateMerge(
    OpenApi.annotations({
      title: "engram coordinator",
      version,
      description:
        "Sessions, hosts, live moves, the reservation ledger and the fleet signal of an engram fleet. " +
        "Every endpoint but `/livez`, `/healthz`, `/readyz`, `/openapi.json` and `/docs` needs `Authorization: Bearer <token>`: " +
        "the admin token, or a host agent's own token, which acts for its own host only. `/metrics` also takes the scrape token. " +
        "Bodies are JSON (send `content-type: application/json`, or none); every error answer is a JSON object with an `error` code.",
      transform: bearerSchemeLowercase,
    }),
  ) {}
