/**
 * The engram tables in drizzle-orm. drizzle-kit generates the committed migrations in
 * `drizzle/` from this file. CHECK constraints are the last line of defence: every value is
 * validated in TypeScript (and by `@engram/core`) before it reaches a statement.
 *
 * Times are epoch milliseconds on the store's time (`Deps.now`): the Effect Clock's, or with
 * `databaseTime` the database's clock as this process reads it (`DatabaseTime.ts`), computed in
 * TypeScript either way (never the server's `now()` in a statement).
 */
import type { Placement } from "@engram/core"
import { sql } from "drizzle-orm"
import {
  bigint,
  boolean,
  check,
  doublePrecision,
  index,
  integer,
  jsonb,
  numeric,
  pgSequence,
  pgTable,
  pgView,
  primaryKey,
  smallint,
  text,
  uniqueIndex,
} from "drizzle-orm/pg-core"

const ms = (name: string) => bigint(name, { mode: "number" })

/**
 * Hosts. `reported_at` is set once the host has reported; `report` is null before that.
 *
 * `reserved_mem_mib`, `reserved_vcpus` and `entries` are the host's reservation sums,
 * maintained in the same statement as every insert into or delete from `reservations`
 * (exact `numeric`: adding and removing the same entries always comes back to 0). They must
 * equal `host_reserved_sums` (the one computation from the ledger) at every commit.
 * `version` is bumped by every change of the sums, the report or the state: a placement that
 * core decided on the row at version v writes only while the row is still at v. Versions come
 * from one sequence (`hostVersionBump`), so a host removed and registered again under the same
 * id starts above every version its earlier row had: a replica's cache (which keeps a row
 * unless a newer version comes) takes the new row, and a plan decided on the old one is refused.
 */
export const hostVersions = pgSequence("hosts_version_seq")

/** The next version of a host row, as SQL text: from the sequence, and never below the row's own next. */
export const hostVersionBumpText = (column: string): string => `greatest(${column} + 1, nextval('hosts_version_seq'))`

/** `hostVersionBumpText` as a drizzle fragment. */
export const hostVersionBump = (column: string) => sql.raw(hostVersionBumpText(column))

export const hosts = pgTable(
  "hosts",
  {
    id: text("id").primaryKey(),
    labels: jsonb("labels").$type<Record<string, string>>().notNull().default({}),
    state: text("state").$type<"ready" | "cordoned" | "draining">().notNull().default("ready"),
    tokenHash: text("token_hash"),
    totalMib: doublePrecision("total_mib"),
    allocatableMib: doublePrecision("allocatable_mib"),
    totalVcpus: bigint("total_vcpus", { mode: "number" }),
    reportedAt: ms("reported_at"),
    // The templates the host's last report said it holds (placement prefers their holders).
    templates: jsonb("templates").$type<Placement.HeldTemplate[]>().notNull().default([]),
    // Where the host's agent serves its peers, as its last report said (null: none advertised).
    peerUrl: text("peer_url"),
    createdAt: ms("created_at").notNull(),
    reservedMemMib: numeric("reserved_mem_mib", { mode: "number" }).notNull().default(0),
    reservedVcpus: numeric("reserved_vcpus", { mode: "number" }).notNull().default(0),
    entries: integer("entries").notNull().default(0),
    version: bigint("version", { mode: "number" }).notNull().default(sql`nextval('hosts_version_seq')`),
  },
  (t) => [
    check("hosts_state_check", sql`${t.state} in ('ready', 'cordoned', 'draining')`),
    check("hosts_total_mib_check", sql`${t.totalMib} is null or ${t.totalMib} >= 0`),
    check("hosts_allocatable_mib_check", sql`${t.allocatableMib} is null or ${t.allocatableMib} >= 0`),
    check("hosts_total_vcpus_check", sql`${t.totalVcpus} is null or ${t.totalVcpus} >= 0`),
    check(
      "hosts_reserved_sums_check",
      sql`${t.reservedMemMib} >= 0 and ${t.reservedVcpus} >= 0 and ${t.entries} >= 0`,
    ),
    // How a coordinator authenticates an agent: the host holding a credential hash. Unique (0021):
    // a token authenticates one host, so a hash issued twice is refused, not answered by either.
    uniqueIndex("hosts_token_hash_idx").on(t.tokenHash).where(sql`${t.tokenHash} is not null`),
  ],
)

/** Sessions. `host_id` and `reservation_id` are set while the session holds a reservation. */
export const sessions = pgTable(
  "sessions",
  {
    id: text("id").primaryKey(),
    state: text("state").notNull(),
    memMib: bigint("mem_mib", { mode: "number" }).notNull(),
    vcpus: bigint("vcpus", { mode: "number" }).notNull(),
    affinity: text("affinity").array().notNull().default(sql`'{}'::text[]`),
    hostId: text("host_id").references(() => hosts.id),
    reservationId: text("reservation_id"),
    queuedAt: ms("queued_at"),
    parkedAt: ms("parked_at"),
    idleTimeoutMs: ms("idle_timeout_ms"),
    lastActiveAt: ms("last_active_at").notNull().default(0),
    endsAt: ms("ends_at"),
    // The template the session starts from (core's `Names.isTemplateName`); null: booted.
    template: text("template"),
    // The host whose agent holds the session's descent image (core's `Session.Record.imageHostId`);
    // no foreign key: a removed host's id only stops ranking first.
    imageHostId: text("image_host_id"),
    createdAt: ms("created_at").notNull(),
    updatedAt: ms("updated_at").notNull(),
  },
  (t) => [
    check(
      "sessions_state_check",
      sql`${t.state} in ('queued', 'pending', 'running', 'parked', 'descending', 'descended', 'moving', 'ended', 'lost')`,
    ),
    check("sessions_mem_mib_check", sql`${t.memMib} > 0`),
    check("sessions_vcpus_check", sql`${t.vcpus} >= 1`),
    check("sessions_queued_check", sql`${t.state} <> 'queued' or ${t.queuedAt} is not null`),
    // The queue in FIFO order, and the parks and descents of the fleet view.
    index("sessions_queue_idx").on(t.queuedAt, t.id).where(sql`${t.state} = 'queued'`),
    index("sessions_host_idx").on(t.hostId).where(sql`${t.hostId} is not null`),
    // A host's assignments list the sessions whose descent image it holds (few: descended, queued, pending).
    index("sessions_image_host_idx").on(t.imageHostId).where(sql`${t.imageHostId} is not null`),
    index("sessions_created_idx").on(t.createdAt, t.id),
    // The reaper's lifetime reads: running sessions by idle deadline, live ones by TTL deadline.
    index("sessions_idle_idx")
      .on(sql`(${t.lastActiveAt} + ${t.idleTimeoutMs})`)
      .where(sql`${t.state} = 'running' and ${t.idleTimeoutMs} is not null`),
    index("sessions_ends_idx").on(t.endsAt).where(sql`${t.endsAt} is not null and ${t.state} <> 'ended'`),
    // Retention (`pruneHistory`): the ended sessions by end time (an ended session never changes
    // again, so `updated_at` is its end), oldest first, without reading the live ones.
    index("sessions_ended_idx").on(t.updatedAt).where(sql`${t.state} = 'ended'`),
    // The count of live sessions by state (`countSessions`, every scrape of /metrics) without the ended history.
    index("sessions_live_state_idx").on(t.state).where(sql`${t.state} <> 'ended'`),
  ],
)

/** The reservation ledger: every budget held on a host (SPEC §3). */
export const reservations = pgTable(
  "reservations",
  {
    id: text("id").primaryKey(),
    hostId: text("host_id")
      .notNull()
      .references(() => hosts.id),
    ownerKind: text("owner_kind").$type<"session" | "move" | "capture" | "external">().notNull(),
    ownerId: text("owner_id").notNull(),
    memMib: doublePrecision("mem_mib").notNull(),
    vcpus: doublePrecision("vcpus").notNull(),
    vramMib: doublePrecision("vram_mib"),
    createdAt: ms("created_at").notNull(),
    lastHeartbeatAt: ms("last_heartbeat_at").notNull(),
    expiresAt: doublePrecision("expires_at"),
    description: text("description"),
  },
  (t) => [
    check("reservations_owner_kind_check", sql`${t.ownerKind} in ('session', 'move', 'capture', 'external')`),
    check("reservations_mem_mib_check", sql`${t.memMib} > 0`),
    check("reservations_vcpus_check", sql`${t.vcpus} >= 0`),
    check("reservations_vram_mib_check", sql`${t.vramMib} is null or ${t.vramMib} >= 0`),
    index("reservations_host_idx").on(t.hostId),
    index("reservations_owner_idx").on(t.ownerId),
  ],
)

/** Live moves (SPEC §5). Rounds and phases are small documents, kept as jsonb. */
export const moves = pgTable(
  "moves",
  {
    id: text("id").primaryKey(),
    sessionId: text("session_id")
      .notNull()
      .references(() => sessions.id),
    sourceHostId: text("source_host_id").notNull(),
    targetHostId: text("target_host_id").notNull(),
    reservationId: text("reservation_id").notNull(),
    maxDowntimeMs: doublePrecision("max_downtime_ms").notNull(),
    state: text("state").$type<"pending" | "committed" | "aborted">().notNull(),
    rounds: jsonb("rounds").notNull().default([]),
    phases: jsonb("phases"),
    abortReason: text("abort_reason"),
    abortEstimateMs: doublePrecision("abort_estimate_ms"),
    /** The source guard's figures of a committed move (core's `Move.Guard`). */
    guard: jsonb("guard"),
    /**
     * The move's source owes its target a resend (`markResendOwed`): it holds the guest's only
     * whole copy, paused. Opens the way back to the source when the target dies (core's `Reclaim.wayBackOf`).
     */
    resendOwed: boolean("resend_owed").notNull().default(false),
    /** How many times the resend mark was cleared (core's `Move.resendClears`, migration 0023): a source's tell naming fewer changes nothing (`Move.resendTellStale`). */
    resendClears: integer("resend_clears").notNull().default(0),
    /** Who committed the move (core's `Move.CommittedBy`); null while not committed, or committed before the column (migration 0022). */
    committedBy: text("committed_by").$type<"source" | "target" | "operator">(),
    createdAt: ms("created_at").notNull(),
    endedAt: ms("ended_at"),
  },
  (t) => [
    check("moves_state_check", sql`${t.state} in ('pending', 'committed', 'aborted')`),
    check("moves_max_downtime_check", sql`${t.maxDowntimeMs} > 0`),
    check("moves_target_check", sql`${t.sourceHostId} <> ${t.targetHostId}`),
    check("moves_committed_by_check", sql`${t.committedBy} in ('source', 'target', 'operator')`),
    // One open move per session.
    uniqueIndex("moves_open_idx").on(t.sessionId).where(sql`${t.state} = 'pending'`),
    // listMoves, oldest first, by host (source or target).
    index("moves_created_idx").on(t.createdAt, t.id),
    index("moves_source_idx").on(t.sourceHostId),
    index("moves_target_idx").on(t.targetHostId),
    // A host's pending moves (its assignments, `listMoves({ hostId, state: "pending" })`): moves
    // are kept for the retention (`pruneHistory`), so the whole-state indexes above walk the
    // host's every kept move.
    index("moves_source_pending_idx").on(t.sourceHostId).where(sql`${t.state} = 'pending'`),
    index("moves_target_pending_idx").on(t.targetHostId).where(sql`${t.state} = 'pending'`),
    // Retention: the ended moves by end time, oldest first; a session's moves (the foreign key's
    // check when a pruned session is deleted, and "no move left" before it is).
    index("moves_ended_idx").on(t.endedAt).where(sql`${t.state} <> 'pending'`),
    index("moves_session_idx").on(t.sessionId),
    // The reaper's read of the aborts still cooling down (`listMoves({ state: "aborted", endedSince })`).
    index("moves_aborted_idx").on(t.endedAt).where(sql`${t.state} = 'aborted'`),
  ],
)

/**
 * Each host pair's recent commit phases (ms, oldest first), at most the allowance policy's
 * window (core's `Downtime.recordCommit` trims them): the guard's learned allowance is made of
 * them, so it survives agent restarts and is the same on every replica.
 */
export const movePairs = pgTable(
  "move_pairs",
  {
    sourceHostId: text("source_host_id").notNull(),
    targetHostId: text("target_host_id").notNull(),
    commitsMs: jsonb("commits_ms").notNull().default([]),
    /** When each of `commits_ms` was recorded (epoch ms), same order (migration 0011; older commits take `updated_at`). */
    recordedAtMs: jsonb("recorded_at_ms").notNull().default([]),
    updatedAt: ms("updated_at").notNull(),
  },
  // The allowance reads the pairs with a recent commit (`updated_at` within the horizon), the
  // latest first; and the pairs into a move's target (`listAllowanceCommits`: the target's pool).
  (t) => [
    primaryKey({ columns: [t.sourceHostId, t.targetHostId] }),
    index("move_pairs_updated_at_idx").on(t.updatedAt),
    index("move_pairs_target_idx").on(t.targetHostId, t.updatedAt),
  ],
)

/**
 * Every session's history: the events core's `Session.step` and `Reclaim.decide`
 * answer, written in the same transaction as the step they come from, numbered from 1 per
 * session. `seq` is the next number under the session's row lock (every writer of a session
 * holds it; a new session's events go in with its insert). No foreign key: the insert of a new
 * session and its events share one statement; a pruned session's events are deleted with it
 * (`pruneHistory`, by the primary key's `session_id` prefix).
 */
export const sessionEvents = pgTable(
  "session_events",
  {
    sessionId: text("session_id").notNull(),
    seq: integer("seq").notNull(),
    at: ms("at").notNull(),
    /** Core's `Session.Event` as it was answered. */
    event: jsonb("event").$type<{ readonly _tag: string }>().notNull(),
  },
  (t) => [primaryKey({ columns: [t.sessionId, t.seq] }), check("session_events_seq_check", sql`${t.seq} >= 1`)],
)

/**
 * The cumulative ledger metrics/**
 * The cumulative ledger metrics, as sharded counter rows summed on read: one hot row
 * would serialize every placement on its row lock, so each transaction adds to the shard
 * of its backend (`pg_backend_pid() % 64`).
 */
export const metrics = pgTable(
  "metrics",
  {
    shard: smallint("shard").notNull(),
    totalReservedMib: doublePrecision("total_reserved_mib").notNull().default(0),
    totalReleasedMib: doublePrecision("total_released_mib").notNull().default(0),
    totalReclaimedMib: doublePrecision("total_reclaimed_mib").notNull().default(0),
    reserveFailures: bigint("reserve_failures", { mode: "number" }).notNull().default(0),
  },
  (t) => [
    primaryKey({ columns: [t.shard] }),
    check("metrics_shard_check", sql`${t.shard} >= 0 and ${t.shard} < 64`),
    check(
      "metrics_nonnegative_check",
      sql`${t.totalReservedMib} >= 0 and ${t.totalReleasedMib} >= 0 and ${t.totalReclaimedMib} >= 0 and ${t.reserveFailures} >= 0`,
    ),
  ],
)

/**
 * The reserved sums of every host that holds entries, computed from the ledger: the one
 * place they are computed. The migration that added the maintained sums backfilled them from
 * this view, and `Room.sumsDriftSql` compares the maintained sums with it.
 */
export const hostReservedSums = pgView("host_reserved_sums", {
  hostId: text("host_id").notNull(),
  memMib: numeric("mem_mib", { mode: "number" }).notNull(),
  vcpus: numeric("vcpus", { mode: "number" }).notNull(),
  entries: integer("entries").notNull(),
}).as(
  sql`select host_id, sum(mem_mib::numeric) as mem_mib, sum(vcpus::numeric) as vcpus, count(*)::int as entries
    from reservations group by host_id`,
)

/**
 * Leases (leadership, SPEC §13): one row per name. `epoch` grows by one with every new holder
 * and fences the holder's writes; `renewals` grows with every renewal, so another replica sees
 * the lease alive by a change, never by comparing its clock with the holder's.
 */
export const leases = pgTable(
  "leases",
  {
    name: text("name").primaryKey(),
    holder: text("holder").notNull(),
    epoch: bigint("epoch", { mode: "number" }).notNull(),
    renewals: bigint("renewals", { mode: "number" }).notNull().default(0),
    leaseDurationMs: bigint("lease_duration_ms", { mode: "number" }).notNull(),
    /** The holder's internal address (the coordinator's placer, `ENGRAM_PLACEMENT_FORWARD`); null when it has none. */
    url: text("url"),
    /**
     * A fingerprint of the holder's admin token (a domain-separated SHA-256, never the token):
     * a replica whose own differs says so (replicas must share `ENGRAM_ADMIN_TOKEN`); null: none.
     */
    adminTokenHash: text("admin_token_hash"),
  },
  (t) => [check("leases_epoch_check", sql`${t.epoch} >= 1`)],
)
