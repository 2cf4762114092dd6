/**
 * The fence (SPEC §13): a write made under a lease (`CurrentFence` set by its leader) runs only
 * while the lease is still at that epoch. The apply statement checks it itself (`Apply.ts`: the
 * lease row `FOR SHARE`, so a takeover, which updates the row, waits until the write committed or
 * rolled back) and writes nothing at another epoch; the store then fails the write `Unavailable`
 * ("fenced"), which also rolls back the transaction it ran in. A check in a statement of its own
 * would not do on the pool: each statement commits alone, on any of its connections.
 */
import { type Fence, Unavailable } from "@engram/store"
import { retryAfterMs } from "./Db.js"

/**
 * Why a write under `f` was refused, given what the statement found (`{ epoch }`: the lease's
 * epoch, null when it has no row) or null when it was at `f`'s epoch.
 */
export const refusal = (f: Fence, found: { readonly epoch: unknown } | null): Unavailable | null =>
  found === null
    ? null
    : new Unavailable({
        reason: `fenced: lease ${f.name} is at epoch ${found.epoch === null || found.epoch === undefined ? "none" : String(found.epoch)}, this write was made under epoch ${f.epoch}`,
        retryAfterMs,
      })
