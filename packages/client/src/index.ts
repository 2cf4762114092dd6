/**
 * @engram/client: a typed client of the engram coordinator. Effect programs use the
 * `EngramClient` service (`EngramClient.layerFetch({ baseUrl, token })`); everyone else
 * `createClient({ baseUrl, token })`, whose calls answer Promises and throw the classes of
 * `Errors` (`instanceof NotFound`, `InvalidInput` with `field` and `rule`, `MoveDowntime`
 * with the estimate…). Lists are pages (`{items, nextCursor}`) with helpers that follow the
 * cursors.
 */
export * as Errors from "./Errors.js"
export * as Page from "./Page.js"
export * as Replicas from "./Replicas.js"
/** The records the calls answer: `@engram/api`'s schemas and types, as the coordinator declares them. */
export { Records } from "@engram/api"

export { EngramClient, make, withResendOwed } from "./EngramClient.js"
export type { CreateSession, EngramClientShape, Input, Move, MoveOptions, MovesQuery, Options, PlaceAnswer, ReservationsQuery, SessionsQuery, WaitFor } from "./EngramClient.js"
export { createClient } from "./Promise.js"
export type { Engram } from "./Promise.js"
export {
  Conflict,
  EngramError,
  Forbidden,
  InvalidInput,
  MoveDowntime,
  MoveFailed,
  NoRoom,
  NotFound,
  PayloadTooLarge,
  TooManyRequests,
  TransportError,
  Unauthorized,
  Unavailable,
  UnexpectedAnswer,
  Unreachable,
  WaitTimeout,
} from "./Errors.js"
export type { ClientError } from "./Errors.js"
