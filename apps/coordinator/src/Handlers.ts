/**
 * The handlers of `EngramApi`, one module per endpoint group under `handlers/`. A handler reads
 * its input, checks the caller where the resource decides (`requireHostOrAdmin`; admin-only
 * operations are refused by the `AdminOnly` middleware before any handler runs), calls the
 * store or a service (`Drainer`, `MoveWaiter`, `Assignments`) and shapes the answer. Every decision
 * about room is core's: no arithmetic here.
 */
import { Layer } from "effect"
import { FleetHandlers } from "./handlers/Fleet.js"
import { HostsHandlers } from "./handlers/Hosts.js"
import { LedgerHandlers } from "./handlers/Ledger.js"
import { MovesHandlers } from "./handlers/Moves.js"
import { OpsHandlers } from "./handlers/Ops.js"
import { SessionsHandlers } from "./handlers/Sessions.js"

/** Every group's handlers. */
export const HandlersLive = Layer.mergeAll(OpsHandlers, HostsHandlers, SessionsHandlers, MovesHandlers, FleetHandlers, LedgerHandlers)
