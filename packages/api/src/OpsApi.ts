/**
 * Liveness, readiness, metrics and the API's own description. Liveness, readiness and the
 * OpenAPI document need no credential and carry no fleet data (SPEC §12); `/metrics` takes the
 * scrape token, the admin token or a host token.
 */
import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema } from "effect/http-api"
import { ServiceUnavailableResponse } from "./Errors.js"
import { doc } from "./internal/doc.js"
import { Alive, Ready } from "./Records.js"
import { ScrapeAuth, StrictInput } from "./Security.js"

/** The Prometheus text exposition format's content type. */
export const prometheusContentType = "text/plain; version=0.0.4; charset=utf-8"

/** `/livez`, `/healthz`, `/readyz`, `/openapi.json` and `/metrics`. */
export class OpsApi extends HttpApiGroup.make("ops", { topLevel: true }).add(
  HttpApiEndpoint.get("livez", "/livez", { success: Alive }).annotateMerge(
    doc("Liveness", "Answers `{ok: true}` while the process serves HTTP. No credential, no data: for a Kubernetes liveness probe."),
  ),
  HttpApiEndpoint.get("healthz", "/healthz", { success: Alive }).annotateMerge(doc("Liveness (older name)", "The same answer as `GET /livez`.")),
  HttpApiEndpoint.get("readyz", "/readyz", { success: Ready, error: ServiceUnavailableResponse }).annotateMerge(
    doc(
      "Readiness",
      "Answers `{ok, store, leader}` once the store answers a read: the backend (`pglite`, `postgres`, `custom`) and whether this replica leads the reaper; on PostgreSQL, once another replica leads, `adminTokenMatchesLeader` (false: the replicas were given different `ENGRAM_ADMIN_TOKEN`s; still ready). 503 with `Retry-After` while the store cannot be read. No credential, no fleet data: for a readiness probe.",
    ),
  ),
  HttpApiEndpoint.get("openapi", "/openapi.json", { success: Schema.Unknown }).annotateMerge(
    doc(
      "This API as OpenAPI 3.1",
      "The machine-readable description of every endpoint. No credential. A browsable reference is at `/docs`. Both carry a strong `ETag` and `Cache-Control: no-cache`: a request whose `If-None-Match` names the tag is answered 304 without a body.",
    ),
  ),
  HttpApiEndpoint.get("metrics", "/metrics", { success: Schema.String.pipe(HttpApiSchema.asText({ contentType: prometheusContentType })) })
    .middleware(StrictInput)
    .middleware(ScrapeAuth)
    .annotateMerge(
      doc(
        "Prometheus metrics",
        "This replica's counters (placements, descents, moves, reaper passes, HTTP requests by route and status), the store's gauges read at scrape time (queue, parks, descents, hosts, free RAM) and process metrics. Takes the scrape token (`ENGRAM_METRICS_TOKEN`), the admin token or a host token.",
      ),
    ),
).middleware(StrictInput) {}
