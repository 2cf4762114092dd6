/**
 * QEMU's migration seen through engram's guard. The source runs QEMU's own pre-copy with
 * `downtime-limit` at 1 ms, so QEMU does not stop the guest on its own unless it expects to send
 * what is left in about 1 ms; each `MIGRATION_PASS` (a dirty-bitmap sync) closes a round whose
 * figures come from `query-migrate` (read just after the pass: a round QEMU finishes within
 * that read counts into the round before, and its own is then empty); after each round engram's guard decides: go on, refuse
 * (`migrate_cancel`, the guest never paused) or pause (`downtime-limit` raised to QEMU's maximum,
 * so QEMU stops the guest at its next iteration). With `pause-before-switchover`, QEMU then
 * waits in `pre-switchover`, guest stopped, before it sends the rest: the post-capture check
 * runs there, and over budget `migrate_cancel` resumes the guest on the source.
 */
import { MoveGuard, type MoveBudget, type MoveRound } from "@engram/runtime"
import type { QmpEvent } from "./Qmp.js"

/** QEMU's `MigrationInfo` (the fields engram reads). */
export interface MigrationInfo {
  readonly status?: string
  readonly ram?: {
    readonly transferred: number
    readonly remaining: number
    readonly total: number
    readonly duplicate: number
    readonly normal: number
    readonly skipped?: number
    readonly "page-size"?: number
    readonly "dirty-sync-count"?: number
    readonly mbps?: number
    readonly "dirty-pages-rate"?: number
    readonly "downtime-bytes"?: number
  }
  readonly downtime?: number
  readonly "expected-downtime"?: number
  readonly "total-time"?: number
  readonly "error-desc"?: string
  readonly "socket-address"?: readonly { readonly type: string; readonly host?: string; readonly port?: string }[]
}

/** QEMU's largest `downtime-limit` (2000 s): "switch over at the next iteration". */
export const maxDowntimeLimitMs = 2_000_000

/**
 * Capabilities for a live move (both sides: pause before switchover, RAM in the stream) or a
 * snapshot (a descent, a restore, a template: no pause; `ignoreShared` leaves a shared RAM file
 * out of the stream). Every migration sets every capability it depends on: QEMU keeps them
 * between migrations, and a move after a failed mapped descent must send the RAM.
 * `ignoreShared: null` for a QEMU without `x-ignore-shared` (before 4.0).
 */
export const capabilities = (o: { readonly pauseBeforeSwitchover: boolean; readonly ignoreShared: boolean | null }) => ({
  capabilities: [
    { capability: "events", state: true },
    { capability: "pause-before-switchover", state: o.pauseBeforeSwitchover },
    ...(o.ignoreShared === null ? [] : [{ capability: "x-ignore-shared", state: o.ignoreShared }]),
  ],
})

/** Pages QEMU has sent (zero pages included), and its page size. */
const pagesOf = (info: MigrationInfo) => (info.ram === undefined ? 0 : info.ram.normal + info.ram.duplicate + (info.ram.skipped ?? 0))
const pageSizeOf = (info: MigrationInfo) => info.ram?.["page-size"] ?? 4096

/** Where the current round started. */
interface Boundary {
  readonly wireBytes: number
  readonly pages: number
  readonly qemuAtMs: number
}

/**
 * The rounds of one outgoing migration, built from its passes: a round ends at each dirty sync
 * and holds what was sent since the previous one. Passes that arrive in a burst (QEMU faster
 * than engram's queries) fold into one round; nothing is counted twice.
 */
export class RoundTracker {
  readonly rounds: MoveRound[] = []
  private boundary: Boundary | null = null
  lastPassQemuMs = 0

  /** The first sync (pass 1, at setup): the bulk round starts. */
  start(pass: QmpEvent): void {
    this.boundary = { wireBytes: 0, pages: 0, qemuAtMs: pass.qemuAtMs }
    this.lastPassQemuMs = pass.qemuAtMs
  }

  get started(): boolean {
    return this.boundary !== null
  }

  /**
   * Closes the round that ends at the sync `atQemuMs`, with the figures of a `query-migrate`
   * made after it; null for a pass at or before the last one.
   */
  close(atQemuMs: number, info: MigrationInfo): MoveRound | null {
    this.lastPassQemuMs = Math.max(this.lastPassQemuMs, atQemuMs)
    const b = this.boundary
    if (b === null || info.ram === undefined || atQemuMs <= b.qemuAtMs) return null
    const wireBytes = Math.max(0, info.ram.transferred - b.wireBytes)
    // Nothing sent since the last round's query, and nothing left: QEMU finished this round
    // before that query (its bytes went to the round before). After the full round that is an
    // empty delta, which is what the guard must see. With pages still to send, the round has
    // only begun: it is closed at the next pass.
    if (wireBytes === 0 && (this.rounds.length === 0 || info.ram.remaining > 0)) return null
    const pages = pagesOf(info)
    const round: MoveRound = {
      kind: this.rounds.length === 0 ? "full" : "delta",
      wireBytes,
      apparentBytes: Math.max(0, pages - b.pages) * pageSizeOf(info),
      sendMs: atQemuMs - b.qemuAtMs,
      captureMs: 0,
    }
    this.boundary = { wireBytes: info.ram.transferred, pages, qemuAtMs: atQemuMs }
    this.rounds.push(round)
    return round
  }

  /**
   * The guest's dirty rate in bytes per ms: the last delta's pages were dirtied during the
   * round before it; QEMU's own `dirty-pages-rate` (a ≥ 1 s window) when no such pair exists.
   */
  dirtyBytesPerMs(info: MigrationInfo): number {
    const n = this.rounds.length
    const last = this.rounds[n - 1]
    const before = this.rounds[n - 2]
    if (last !== undefined && before !== undefined && last.kind === "delta" && before.sendMs > 0) return last.apparentBytes / before.sendMs
    return ((info.ram?.["dirty-pages-rate"] ?? 0) * pageSizeOf(info)) / 1000
  }
}

/** The final round as known at `pre-switchover`: what is still dirty plus what the guest dirtied between the last sync and the stop. */
export const finalApparentBytes = (info: MigrationInfo, tracker: RoundTracker, stopQemuMs: number): number =>
  (info.ram?.remaining ?? 0) + tracker.dirtyBytesPerMs(info) * Math.max(0, stopQemuMs - tracker.lastPassQemuMs)

/** The guard's verdict at `pre-switchover` (core's arithmetic, via `MoveGuard`). */
export const postCapture = (tracker: RoundTracker, captureMs: number, finalApparent: number, budget: MoveBudget, guest: MoveGuard.Guest = MoveGuard.running) =>
  MoveGuard.postCapture(tracker.rounds, { captureMs, apparentBytes: finalApparent }, budget, guest)

/** Single-quotes a path for QEMU's `exec:` migration URIs (run by `/bin/sh -c`). */
export const shellQuote = (s: string): string => `'${s.replaceAll("'", `'\\''`)}'`

/** The port QEMU listens on for an incoming migration (`tcp:…:0` picks one). */
export const listeningPort = (info: MigrationInfo): number | undefined => {
  const port = info["socket-address"]?.find((a) => a.type === "inet")?.port
  return port === undefined ? undefined : Number(port)
}
