/**
 * A host's assignments (`hostAssignments`) in one statement: the host's id (found by its key: an
 * unknown host is no row), its sessions in the assigned states and its pending moves, each list
 * aggregated into json inside the statement. Not the host's row: the coordinator discards it.
 * An agent's first poll after a reconnect is this read; thousands of agents reconnecting at once
 * made three reads (the host, its sessions, its moves) the coordinator's bottleneck. The text is
 * constant (the states travel as one jsonb parameter), so it is prepared once per connection;
 * the sessions come by `sessions_host_idx`, the moves by the partial (pending only) indexes
 * `moves_source_pending_idx` and `moves_target_pending_idx`, never through the host's ended moves;
 * the ids of the sessions whose descent image the host holds by the partial index
 * `sessions_image_host_idx` (only sessions with an image host are in it).
 *
 * Concurrent reads share one statement (`Batcher`: the hosts' ids as one jsonb parameter, at
 * most 256 a statement, two statements at once): 10,000 agents reconnecting at once made 10,000
 * statements, each a round trip and a parse on both sides; now a few dozen. A read alone still
 * goes at once (a batch leaves as soon as a slot is free). One statement reads every host of
 * its group in one snapshot, as it read each alone.
 */
import { assignedStates, NotFound } from "@engram/store"
import type { HostAssignments, StoreShape } from "@engram/store"
import { sql } from "drizzle-orm"
import { Effect } from "effect"
import * as Batcher from "./Batcher.js"
import { anyJson, dieOnUnique } from "./Db.js"
import type { DbError } from "./Db.js"
import type { Deps } from "./Deps.js"
import { json, num, numOrNull } from "./HostRows.js"
import { toMove, toSession } from "./Rows.js"
import type { MoveRow, SessionRow } from "./Rows.js"

const states = JSON.stringify(assignedStates)

/**
 * The columns of a host's assignments, for the host `h` of the statement's `from`. Oldest first,
 * as `listSessions` and `listMoves` order them. A move's source and target differ
 * (`moves_target_check`), so the two halves of the union never hold the same move.
 */
const assignmentColumns = sql`h.id as "hostId",
    coalesce((select jsonb_agg(to_jsonb(s) order by s.created_at, s.id) from sessions s
      where s.host_id = h.id and s.state in (select jsonb_array_elements_text(${states}::jsonb))), '[]'::jsonb) as "sessions",
    coalesce((select jsonb_agg(to_jsonb(m) order by m.created_at, m.id) from (
        select * from moves where source_host_id = h.id and state = 'pending'
        union all
        select * from moves where target_host_id = h.id and state = 'pending') m), '[]'::jsonb) as "moves",
    coalesce((select jsonb_agg(s.id order by s.id collate "C") from sessions s where s.image_host_id = h.id), '[]'::jsonb) as "imageSessionIds"`

/** The statement for one host. */
export const assignmentsSql = (hostId: string) => sql`select ${assignmentColumns} from hosts h where h.id = ${hostId}`

/**
 * The statement for several hosts at once: the same columns as {@link assignmentsSql}, one row
 * per known host (an unknown host is no row); the ids travel as one jsonb parameter, so the
 * text is constant whatever their number, and are probed in the primary key (`anyJson`: not a
 * hash join over every host).
 */
export const groupAssignmentsSql = (hostIds: readonly string[]) =>
  sql`select ${assignmentColumns} from hosts h where ${anyJson(sql`h.id`, hostIds)}`

/** The most hosts one grouped statement reads. */
export const maxGroupedReads = 256

type Json = Record<string, unknown>

/** A session's row from its `to_jsonb` (snake_case keys, numbers as json numbers). */
const sessionRowOf = (j: Json): SessionRow => ({
  id: j["id"] as string,
  state: j["state"] as string,
  memMib: num(j["mem_mib"]),
  vcpus: num(j["vcpus"]),
  affinity: (j["affinity"] ?? []) as string[],
  hostId: (j["host_id"] ?? null) as string | null,
  reservationId: (j["reservation_id"] ?? null) as string | null,
  queuedAt: numOrNull(j["queued_at"]),
  parkedAt: numOrNull(j["parked_at"]),
  idleTimeoutMs: numOrNull(j["idle_timeout_ms"]),
  lastActiveAt: num(j["last_active_at"]),
  endsAt: numOrNull(j["ends_at"]),
  template: (j["template"] ?? null) as string | null,
  imageHostId: (j["image_host_id"] ?? null) as string | null,
  createdAt: num(j["created_at"]),
  updatedAt: num(j["updated_at"]),
})

/** A move's row from its `to_jsonb`. */
const moveRowOf = (j: Json): MoveRow => ({
  id: j["id"] as string,
  sessionId: j["session_id"] as string,
  sourceHostId: j["source_host_id"] as string,
  targetHostId: j["target_host_id"] as string,
  reservationId: j["reservation_id"] as string,
  maxDowntimeMs: num(j["max_downtime_ms"]),
  state: j["state"] as MoveRow["state"],
  rounds: j["rounds"] ?? [],
  phases: j["phases"] ?? null,
  abortReason: (j["abort_reason"] ?? null) as string | null,
  abortEstimateMs: numOrNull(j["abort_estimate_ms"]),
  guard: j["guard"] ?? null,
  resendOwed: j["resend_owed"] === true,
  resendClears: typeof j["resend_clears"] === "number" ? j["resend_clears"] : 0,
  committedBy: (j["committed_by"] ?? null) as MoveRow["committedBy"],
  createdAt: num(j["created_at"]),
  endedAt: numOrNull(j["ended_at"]),
})

/** The assignments operation of the store. */
export const make = ({ db }: Deps): Pick<StoreShape, "hostAssignments"> => {
  const answerOf = (row: Record<string, unknown>): HostAssignments => ({
    hostId: row["hostId"] as string,
    sessions: json<Json[]>(row["sessions"]).map((j) => toSession(sessionRowOf(j))),
    moves: json<Json[]>(row["moves"]).map((j) => toMove(moveRowOf(j))),
    imageSessionIds: json<string[]>(row["imageSessionIds"]),
  })
  // Reads share statements; they take no lock, so any two may share one (no keys).
  const reads = Batcher.make<string, HostAssignments | undefined, DbError>({
    name: "assignments",
    maxBatch: maxGroupedReads,
    maxInFlight: 2,
    keysOf: () => [],
    run: (hostIds) =>
      Effect.map(db.pool.query(hostIds.length === 1 ? assignmentsSql(hostIds[0] as string) : groupAssignmentsSql([...new Set(hostIds)])), (rows) => {
        const byId = new Map(rows.map((r) => [r["hostId"] as string, r]))
        return hostIds.map((id) => {
          const row = byId.get(id)
          return row === undefined ? undefined : answerOf(row)
        })
      }),
  })
  return {
    hostAssignments: (hostId) =>
      Effect.flatMap(reads(hostId), (answer) => (answer === undefined ? Effect.fail(new NotFound({ entity: "host", id: hostId })) : Effect.succeed(answer))).pipe(dieOnUnique),
  }
}
