/**
 * The reservation ledger (SPEC §3): admission (core's `Ledger.admit` under the host's lock),
 * release, heartbeats, reclaim (core's `Reclaim.plan` over the locked entries, sessions and
 * moves), summaries and the cumulative metrics.
 */
import { Ledger as LedgerRules, Reclaim } from "@engram/core"
import type { LedgerEntry } from "@engram/core"
import { Conflict, Cursor, NotFound, Refused, Validate } from "@engram/store"
import type { ReclaimResult, Reservation, ReserveInput, StoreShape } from "@engram/store"
import { and, asc, eq, gt, sql } from "drizzle-orm"
import { Effect } from "effect"
import { inJson, query } from "./Db.js"
import type { Deps } from "./Deps.js"
import { lockHosts } from "./Locks.js"
import * as Pages from "./Pages.js"
import { readRoom, toCandidate } from "./Room.js"
import type { RoomRow } from "./Room.js"
import { toMove, toReservation, toSession } from "./Rows.js"
import { hosts, moves, reservations, sessions } from "./schema.js"
import { err, ok, retry } from "./Transaction.js"
import { countReserveFailure, insertEntry, insertEvents, lockHostRows, removeEntries, updateMove, updateSessions } from "./Writes.js"

type LedgerOps = Pick<
  StoreShape,
  | "reserve"
  | "release"
  | "heartbeat"
  | "heartbeatHost"
  | "getReservation"
  | "listReservations"
  | "pageReservations"
  | "reclaim"
  | "hostSummary"
  | "clusterSummary"
  | "metrics"
>

const byId = (a: { readonly id: string }, b: { readonly id: string }): number => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0)

/** The ledger operations of the store. */
export const make = ({ op, read, both, now, limits }: Deps): LedgerOps => {
  const summaryOf = (row: RoomRow, entries: readonly LedgerEntry[], t: number): LedgerRules.HostSummary =>
    LedgerRules.summarizeHost(row.id, toCandidate(row, limits()).headroom.allocatableMib, entries, t, limits())

  const reserve: StoreShape["reserve"] = (input: ReserveInput) =>
    Effect.gen(function* () {
      const t = yield* now
      const bad = Validate.ownerKind(input.ownerKind) ?? Validate.reserveExtras(input, t)
      if (bad) return yield* bad
      return yield* op<Reservation, Refused | Conflict>(
        async (tx) => {
          let duplicate = false
          let host: LedgerRules.HostView | undefined
          const id = input.id
          const hostId = input.hostId
          if (typeof hostId === "string" && hostId !== "") {
            await lockHosts(tx, [hostId])
            const [dup, rows] = await both(
              () =>
                typeof id === "string" && id !== ""
                  ? tx.select({ id: reservations.id }).from(reservations).where(eq(reservations.id, id))
                  : Promise.resolve([]),
              () => readRoom(tx, { hostIds: [hostId] }),
            )
            duplicate = dup.length > 0
            const row = rows[0]
            if (row !== undefined) {
              const c = toCandidate(row, limits())
              host = { state: row.state, measured: c.measured ?? false, headroom: c.headroom, entries: row.entries }
            }
          } else if (typeof id === "string" && id !== "") {
            duplicate = (await tx.select({ id: reservations.id }).from(reservations).where(eq(reservations.id, id))).length > 0
          }
          const admission = LedgerRules.admit(input, { duplicate, host }, limits())
          if (admission._tag === "Refuse") {
            if (admission.check === "duplicate") return err(new Conflict({ entity: "reservation", id: String(id), reason: admission.message }))
            await countReserveFailure(tx)
            return err(new Refused({ check: admission.check, reason: admission.message }))
          }
          const entry = LedgerRules.entryOf({ ...input, id: id as string, hostId: hostId as string }, t)
          await insertEntry(tx, { ...entry, now: t })
          return ok(entry)
        },
        () => new Conflict({ entity: "reservation", id: String(input.id), reason: `reservation ${String(input.id)} already exists` }),
      )
    })

  const reclaim: StoreShape["reclaim"] = () =>
    Effect.gen(function* () {
      const t = yield* now
      return yield* op<ReclaimResult, never>(async (tx) => {
        // Liveness is core's rule: read the figures it needs (no lock), let it judge, then lock
        // what the plan may touch in the one lock order of the store — sessions, moves,
        // reservations, hosts (as ending a session and committing its move do) — and judge again.
        const all = await tx
          .select({
            id: reservations.id,
            expiresAt: reservations.expiresAt,
            lastHeartbeatAt: reservations.lastHeartbeatAt,
            ownerKind: reservations.ownerKind,
            ownerId: reservations.ownerId,
          })
          .from(reservations)
        const suspects = LedgerRules.reclaimable(all, t, limits())
        if (suspects.length === 0) return ok({ reclaimed: [], lostSessions: [] })
        const ownerIds = (kind: string) => [...new Set(suspects.filter((e) => e.ownerKind === kind).map((e) => e.ownerId))].sort()
        const moveOwners = ownerIds("move")
        const movesSessions =
          moveOwners.length === 0
            ? []
            : (await tx.select({ sessionId: moves.sessionId }).from(moves).where(inJson(moves.id, moveOwners))).map((m) => m.sessionId)
        const sessionIds = [...new Set([...ownerIds("session"), ...movesSessions])].sort()
        const sessionRows =
          sessionIds.length === 0 ? [] : await tx.select().from(sessions).where(inJson(sessions.id, sessionIds)).orderBy(sessions.id).for("update")
        const lockedSessions = new Set(sessionRows.map((r) => r.id))
        const moveRows =
          sessionIds.length + moveOwners.length === 0
            ? []
            : await tx
                .select()
                .from(moves)
                .where(and(eq(moves.state, "pending"), sql`(${inJson(moves.id, moveOwners)} or ${inJson(moves.sessionId, sessionIds)})`))
                .orderBy(moves.id)
                .for("update")
        const lockedMoves = new Set(moveRows.map((m) => m.id))
        const locked = await tx
          .select()
          .from(reservations)
          .where(inJson(reservations.id, suspects.map((e) => e.id)))
          .orderBy(reservations.id)
          .for("update")
        const wanted = Reclaim.wanted(locked.map(toReservation), t, limits())
        // An entry changed hands after the first read (a commit gives a move's entry to its
        // session): read again, with the locks this pass needs.
        if (wanted.sessionIds.some((id) => !lockedSessions.has(id)) || wanted.moveIds.some((id) => !lockedMoves.has(id))) return retry
        if (wanted.doomed.length === 0) return ok({ reclaimed: [], lostSessions: [] })
        const plan = Reclaim.plan({ entries: wanted.doomed, sessions: sessionRows.map(toSession), openMoves: moveRows.map(toMove) }, t, limits())
        await lockHostRows(tx, locked.filter((e) => plan.reclaimed.some((r) => r.id === e.id) || plan.released.includes(e.id)).map((e) => e.hostId))
        const reclaimed = await removeEntries(tx, plan.reclaimed.map((e) => e.id), "reclaimed")
        await removeEntries(tx, plan.released, "released")
        for (const m of plan.moves) await updateMove(tx, m)
        await updateSessions(tx, plan.sessions)
        await insertEvents(
          tx,
          plan.events.map(({ sessionId, event }) => ({ sessionId, at: t, events: [event] })),
        )
        return ok({ reclaimed: reclaimed.sort(byId), lostSessions: [...plan.lostSessions] })
      })
    })

  return {
    reserve,

    release: (id) =>
      op<Reservation, NotFound | Refused>(async (tx) => {
        const [e] = await tx.select().from(reservations).where(eq(reservations.id, id)).for("update")
        if (e === undefined) return err(new NotFound({ entity: "reservation", id }))
        const owned = LedgerRules.refuseRelease(e)
        if (owned) return err(new Refused({ check: owned.check, reason: owned.message }))
        await removeEntries(tx, [id], "released")
        return ok(toReservation(e))
      }),

    heartbeat: (id) =>
      Effect.gen(function* () {
        const t = yield* now
        const rows = yield* read((exec) => exec.update(reservations).set({ lastHeartbeatAt: t }).where(eq(reservations.id, id)).returning())
        const row = rows[0]
        if (row === undefined) return yield* new NotFound({ entity: "reservation", id })
        return toReservation(row)
      }),

    heartbeatHost: (hostId) =>
      Effect.gen(function* () {
        const t = yield* now
        return yield* op<number, NotFound>(async (tx) => {
          const [h] = await tx.select({ id: hosts.id }).from(hosts).where(eq(hosts.id, hostId))
          if (h === undefined) return err(new NotFound({ entity: "host", id: hostId }))
          // The rows locked in id order (the order reclaim locks them in), then renewed.
          const renewed = await tx
            .update(reservations)
            .set({ lastHeartbeatAt: t })
            .where(
              sql`${reservations.id} in (select id from reservations where host_id = ${hostId}
                and owner_kind in (select jsonb_array_elements_text(${JSON.stringify(LedgerRules.renewedByHost)}::jsonb))
                order by id for update)`,
            )
            .returning({ id: reservations.id })
          return ok(renewed.length)
        })
      }),

    getReservation: (id) =>
      Effect.flatMap(
        read((exec) => exec.select().from(reservations).where(eq(reservations.id, id))),
        (rows) => (rows[0] === undefined ? Effect.fail(new NotFound({ entity: "reservation", id })) : Effect.succeed(toReservation(rows[0]))),
      ),

    pageReservations: (filter = {}, page) =>
      Effect.gen(function* () {
        const bad = Validate.filter("hostId", filter.hostId)
        if (bad) return yield* bad
        const { after, limit } = yield* Pages.check("reservations", page)
        const rows = yield* read((exec) =>
          exec
            .select()
            .from(reservations)
            .where(
              and(
                filter.hostId === undefined ? undefined : eq(reservations.hostId, filter.hostId),
                after === undefined ? undefined : gt(reservations.id, after[0]),
              ),
            )
            .orderBy(asc(reservations.id))
            .limit(limit + 1),
        )
        return Cursor.pageOf("reservations", rows.map(toReservation), (e) => [e.id], limit)
      }),

    listReservations: (filter = {}) =>
      Effect.map(
        read((exec) =>
          exec
            .select()
            .from(reservations)
            .where(filter.hostId === undefined ? undefined : eq(reservations.hostId, filter.hostId))
            .orderBy(asc(reservations.id)),
        ),
        (rows) => rows.map(toReservation),
      ),

    reclaim,

    hostSummary: (hostId) =>
      Effect.gen(function* () {
        const t = yield* now
        return yield* op<LedgerRules.HostSummary, NotFound>(async (tx) => {
          const [rows, entries] = await both(
            () => readRoom(tx, { hostIds: [hostId] }),
            () => tx.select().from(reservations).where(eq(reservations.hostId, hostId)),
          )
          const row = rows[0]
          if (row === undefined) return err(new NotFound({ entity: "host", id: hostId }))
          return ok(summaryOf(row, entries.map(toReservation), t))
        })
      }),

    clusterSummary: () =>
      Effect.gen(function* () {
        const t = yield* now
        return yield* op<LedgerRules.ClusterSummary, never>(async (tx) => {
          const [rows, entries] = await both(
            () => readRoom(tx),
            () => tx.select().from(reservations),
          )
          const byHost = new Map<string, LedgerEntry[]>()
          for (const e of entries) {
            const list = byHost.get(e.hostId)
            if (list === undefined) byHost.set(e.hostId, [toReservation(e)])
            else list.push(toReservation(e))
          }
          return ok(LedgerRules.summarizeCluster(rows.map((r) => summaryOf(r, byHost.get(r.id) ?? [], t))))
        })
      }),

    metrics: () =>
      Effect.map(
        read((exec) =>
          query<Record<string, unknown>>(
            exec,
            sql`select
              coalesce((select sum(total_reserved_mib) from metrics), 0)::float8 as "totalReservedMib",
              coalesce((select sum(total_released_mib) from metrics), 0)::float8 as "totalReleasedMib",
              coalesce((select sum(total_reclaimed_mib) from metrics), 0)::float8 as "totalReclaimedMib",
              coalesce((select sum(reserve_failures) from metrics), 0)::float8 as "reserveFailures",
              (select count(*) from reservations)::float8 as "activeEntries"`,
          ),
        ),
        (rows): LedgerRules.Metrics => {
          const r = rows[0] ?? {}
          return {
            totalReservedMib: Number(r["totalReservedMib"] ?? 0),
            totalReleasedMib: Number(r["totalReleasedMib"] ?? 0),
            totalReclaimedMib: Number(r["totalReclaimedMib"] ?? 0),
            reserveFailures: Number(r["reserveFailures"] ?? 0),
            activeEntries: Number(r["activeEntries"] ?? 0),
          }
        },
      ),
  }
}
