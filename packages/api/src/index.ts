/**
 * @engram/api: the engram coordinator's HTTP API as an Effect `HttpApi` (groups, endpoints,
 * JSON schemas, typed errors, security), and an Effect client with its auth layer.
 */
export * as Client from "./Client.js"
export * as Errors from "./Errors.js"
export * as Payloads from "./Payloads.js"
export * as Records from "./Records.js"
export * as Security from "./Security.js"
export * as StrictJson from "./StrictJson.js"
export * as Urls from "./Urls.js"

export { EngramApi } from "./EngramApi.js"
export { FleetApi } from "./FleetApi.js"
export { HostsApi } from "./HostsApi.js"
export { LedgerApi } from "./LedgerApi.js"
export { MovesApi } from "./MovesApi.js"
export { OpsApi } from "./OpsApi.js"
export { SessionsApi } from "./SessionsApi.js"
export {
  BadRequest,
  ConflictError,
  Forbidden,
  NotFoundError,
  PayloadTooLarge,
  ServiceUnavailable,
  TooManyRequests,
  Unauthorized,
  UnsupportedMediaType,
  WaitTimeout,
} from "./Errors.js"
export type { ApiError } from "./Errors.js"
export { AdminOnly, BearerAuth, CurrentPrincipal, InputErrors, ScrapeAuth, StrictInput } from "./Security.js"
export type { Principal } from "./Security.js"
