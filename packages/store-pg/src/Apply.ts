/**
 * The apply: the one function of the store that writes what core decided. It takes a group of
 * plans (`@engram/core` `Plan`: one operation's, or a group's — creates placed together, a queue
 * drain, a batch of resumes, a reclaim's cascade) and writes them in one statement:
 *
 * 1. each plan is checked against the rows as they are when the statement runs: every session
 *    it writes is still in the state it was decided on (a new one: no session has its id);
 * 2. each host's sums change by the reservations made and released by the plans that passed,
 *    in one `UPDATE` that is also the compare-and-set of the host version those plans relied on
 *    (`hosts.version`, bumped by every change of a host's room, report or state): all the plans
 *    on a host land, or — the host changed since the decision — none;
 * 3. for the plans that landed: the sessions inserted or updated, the reservations inserted,
 *    released or handed over, the moves opened or updated, the history (each event numbered
 *    after its session's last), and the cumulative metrics.
 *
 * A session a plan updates is locked by the caller's transaction (`FOR UPDATE`), so its check
 * holds until the statement writes; a new session's insert that races another of the same id is
 * a unique violation, which undoes the statement (the caller splits its group or answers the
 * session as it is). The hosts a group writes are locked in id order (the store's one lock
 * order) before the first is written: by the statement itself (`lk`), and inside a transaction
 * by a lock of the hosts it changes sent first, in the same round trip. The host rows written are answered
 * and learned by the host cache once the transaction has committed. A write made under a
 * leader's lease (`CurrentFence`) is fenced (`Fence.ts`): refused whole when a newer epoch exists.
 */
import { Plan } from "@engram/core"
import { CurrentFence, type Fence as LeaseFence } from "@engram/store"
import { sql } from "drizzle-orm"
import type { SQL } from "drizzle-orm"
import { Effect } from "effect"
import { anyJson } from "./Db.js"
import type { Conn } from "./Db.js"
import * as Fence from "./Fence.js"
import type { HostCache } from "./HostCache.js"
import { hostColumns, json, toHostRow } from "./HostRows.js"
import { hostVersionBump } from "./schema.js"

const rowsOf = (key: string, columns: string): SQL =>
  sql.raw(`select * from jsonb_to_recordset((select d->'${key}' from doc)) as x(${columns})`)

const moveColumns =
  "p int, id text, sid text, src text, dst text, rid text, max float8, state text, rounds jsonb, phases jsonb, reason text, est float8, cby text, cat bigint, eat bigint"

/** The statement of a group, its rows as one jsonb parameter (the text never changes: it is prepared once per connection). */
// A session's last_active_at only moves forward (greatest): activity an agent reported after a
// step's read stands when the step is written. Each session's state (a session's state is never
// null: no row answers null) and its last event number are scalar subqueries, each a
// primary-key probe: as joins (or EXISTS, which the planner may hash), the planner, which
// guesses 100 rows for any jsonb_to_recordset, scanned the whole sessions and session_events
// tables for them, so a group's statement cost grew with every session stored. The hosts a group
// changes are found by key (`= any(array(…))`, an index condition): the join alone read every host.
// Those keys are `lk`'s, which locks the rows in id order (the store's one lock order, as
// `lockHostsSql` in a transaction): the array is built, so every lock taken, before the
// `UPDATE` writes its first row. In the order the plan visited them (storage order), two
// replicas' groups over the same hosts each held one and waited on the other: a deadlock,
// broken after `deadlock_timeout` by failing one group.
export const applySql = (doc: string): SQL => sql`with doc as (select ${doc}::jsonb as d),
    p as (${rowsOf("p", "p int, hid text, v bigint")}),
    s as (${rowsOf("s", `p int, sid text, "from" text, state text, mem bigint, vcpus bigint, aff jsonb, hid text, rid text, qat bigint, pat bigint, itm bigint, lat bigint, eat bigint, tpl text, ihid text, cat bigint, uat bigint`)}),
    r as (${rowsOf("r", "p int, id text, hid text, kind text, owner text, mem float8, vcpus float8, vram float8, cat bigint, beat bigint, exp float8, descr text")}),
    l as (${rowsOf("l", "p int, id text, hid text, mem float8, vcpus float8, how text")}),
    t as (${rowsOf("t", "p int, id text, owner text, beat bigint")}),
    mo as (${rowsOf("o", moveColumns)}),
    mu as (${rowsOf("u", moveColumns)}),
    e as (${rowsOf("e", "p int, sid text, n int, at bigint, ev jsonb")}),
    stale as (
      select distinct x.p from (select s.p, s."from", (select cur.state from sessions cur where cur.id = s.sid) as cur from s) x
      where case when x."from" is null then x.cur is not null else x.cur is distinct from x."from" end
    ),
    fz as (select d->'f'->>'n' as n, (d->'f'->>'e')::bigint as e from doc where d->'f' <> 'null'::jsonb),
    fence as (select leases.epoch from leases join fz on leases.name = fz.n for share of leases),
    fenced as (select (select epoch from fence) as epoch from fz where not exists (select 1 from fence where fence.epoch = fz.e)),
    live as (select p.* from p where not exists (select 1 from stale where stale.p = p.p) and not exists (select 1 from fenced)),
    delta as (
      select hid, sum(mem) as mem, sum(vcpus) as vcpus, sum(n)::int as n, max(v) as v from (
        select live.hid, 0::numeric as mem, 0::numeric as vcpus, 0 as n, live.v from live where live.hid is not null
        union all select r.hid, r.mem::numeric, r.vcpus::numeric, 1, null from r join live using (p)
        union all select l.hid, -l.mem::numeric, -l.vcpus::numeric, -1, null from l join live using (p)
      ) x group by hid
    ),
    lk as materialized (select id from hosts where id = any(array(select hid from delta)) order by id for no key update),
    h as (
      update hosts set
        reserved_mem_mib = hosts.reserved_mem_mib + delta.mem,
        reserved_vcpus = hosts.reserved_vcpus + delta.vcpus,
        entries = hosts.entries + delta.n,
        version = ${hostVersionBump("hosts.version")}
      from delta
      where hosts.id = any(array(select id from lk)) and hosts.id = delta.hid and (delta.v is null or hosts.version = delta.v)
      returning ${hostColumns("hosts", "room")}
    ),
    ok as (select live.p from live left join h on h.id = live.hid where live.hid is null or h.id is not null),
    si as (
      insert into sessions (id, state, mem_mib, vcpus, affinity, host_id, reservation_id, queued_at, parked_at, idle_timeout_ms, last_active_at, ends_at,
        template, image_host_id, created_at, updated_at)
      select s.sid, s.state, s.mem, s.vcpus, array(select jsonb_array_elements_text(s.aff)), s.hid, s.rid, s.qat, s.pat, s.itm, s.lat, s.eat, s.tpl, s.ihid, s.cat, s.uat
      from s join ok using (p) where s."from" is null
    ),
    su as (
      update sessions set state = s.state, host_id = s.hid, reservation_id = s.rid, queued_at = s.qat, parked_at = s.pat,
        last_active_at = greatest(sessions.last_active_at, s.lat), ends_at = s.eat, image_host_id = s.ihid, updated_at = s.uat
      from s join ok using (p) where s."from" is not null and sessions.id = s.sid
    ),
    ri as (
      insert into reservations (id, host_id, owner_kind, owner_id, mem_mib, vcpus, vram_mib, created_at, last_heartbeat_at, expires_at, description)
      select r.id, r.hid, r.kind, r.owner, r.mem, r.vcpus, r.vram, r.cat, r.beat, r.exp, r.descr from r join ok using (p)
      returning mem_mib
    ),
    rd as (
      delete from reservations using l join ok using (p) where reservations.id = l.id
      returning reservations.mem_mib, l.how
    ),
    rt as (
      update reservations set owner_kind = 'session', owner_id = t.owner, last_heartbeat_at = greatest(reservations.last_heartbeat_at, t.beat)
      from t join ok using (p) where reservations.id = t.id
    ),
    oi as (
      insert into moves (id, session_id, source_host_id, target_host_id, reservation_id, max_downtime_ms, state, rounds, phases,
        abort_reason, abort_estimate_ms, created_at, ended_at)
      select mo.id, mo.sid, mo.src, mo.dst, mo.rid, mo.max, mo.state, mo.rounds, nullif(mo.phases, 'null'::jsonb), mo.reason, mo.est, mo.cat, mo.eat
      from mo join ok using (p)
    ),
    ou as (
      update moves set state = mu.state, rounds = mu.rounds, phases = nullif(mu.phases, 'null'::jsonb), abort_reason = mu.reason,
        abort_estimate_ms = mu.est, committed_by = coalesce(mu.cby, moves.committed_by), ended_at = mu.eat
      from mu join ok using (p) where moves.id = mu.id
    ),
    ev as (
      insert into session_events (session_id, seq, at, event)
      select e.sid, coalesce((select max(last.seq) from session_events last where last.session_id = e.sid), 0) + e.n, e.at, e.ev
      from e join ok using (p)
    ),
    m as (
      insert into metrics (shard, total_reserved_mib, total_released_mib, total_reclaimed_mib)
      select pg_backend_pid() % 64,
        coalesce((select sum(mem_mib) from ri), 0),
        coalesce((select sum(mem_mib) from rd where how = 'released'), 0),
        coalesce((select sum(mem_mib) from rd where how = 'reclaimed'), 0)
      where exists (select 1 from ri) or exists (select 1 from rd)
      on conflict (shard) do update set
        total_reserved_mib = metrics.total_reserved_mib + excluded.total_reserved_mib,
        total_released_mib = metrics.total_released_mib + excluded.total_released_mib,
        total_reclaimed_mib = metrics.total_reclaimed_mib + excluded.total_reclaimed_mib
    )
    select
      (select coalesce(json_agg(json_build_object('p', p.p, 'ok', ok.p is not null, 'stale', stale.p is not null) order by p.p), '[]'::json)
        from p left join ok on ok.p = p.p left join stale on stale.p = p.p) as outcomes,
      (select coalesce(json_agg(h), '[]'::json) from h) as hosts,
      (select json_build_object('epoch', epoch) from fenced) as fenced`

/**
 * The rows of a group, keyed as `applySql` reads them; each plan's index is its `p`. `f`: the
 * lease the group is written under, if any.
 */
export const docOf = (plans: readonly Plan.Plan[], fence: LeaseFence | null = null): string => {
  const p: unknown[] = []
  const s: unknown[] = []
  const r: unknown[] = []
  const l: unknown[] = []
  const t: unknown[] = []
  const o: unknown[] = []
  const u: unknown[] = []
  const e: unknown[] = []
  plans.forEach((plan, k) => {
    p.push({ p: k, hid: plan.host?.hostId ?? null, v: plan.host?.version ?? null })
    for (const { record: x, from } of plan.sessions)
      s.push({
        p: k,
        sid: x.id,
        from,
        state: x.state,
        mem: x.budget.memMib,
        vcpus: x.budget.vcpus,
        aff: x.affinity,
        hid: x.hostId,
        rid: x.reservationId,
        qat: x.queuedAt,
        pat: x.parkedAt,
        itm: x.idleTimeoutMs,
        lat: x.lastActiveAt,
        eat: x.endsAt,
        tpl: x.template,
        ihid: x.imageHostId,
        cat: x.createdAt,
        uat: x.updatedAt,
      })
    for (const c of plan.ledger) {
      if (c._tag === "Reserve") {
        const x = c.entry
        r.push({
          p: k,
          id: x.id,
          hid: x.hostId,
          kind: x.ownerKind,
          owner: x.ownerId,
          mem: x.memMib,
          vcpus: x.vcpus,
          vram: x.vramMib,
          cat: x.createdAt,
          beat: x.lastHeartbeatAt,
          exp: x.expiresAt,
          descr: x.description,
        })
      } else if (c._tag === "Release") l.push({ p: k, id: c.id, hid: c.hostId, mem: c.memMib, vcpus: c.vcpus, how: c.how })
      else t.push({ p: k, id: c.id, owner: c.ownerId, beat: c.heartbeatAt })
    }
    for (const c of plan.moves) {
      const m = c.move
      ;(c._tag === "Open" ? o : u).push({
        p: k,
        id: m.id,
        sid: m.sessionId,
        src: m.sourceHostId,
        dst: m.targetHostId,
        rid: m.reservationId,
        max: m.maxDowntimeMs,
        state: m.state,
        rounds: m.rounds,
        phases: m.phases,
        reason: m.abortReason,
        est: m.abortEstimateMs,
        cby: m.committedBy ?? null,
        cat: m.createdAt,
        eat: m.endedAt,
      })
    }
    // Each event numbered after the ones before it of its session in this plan (`checkGroup`: one plan writes a session).
    const n = new Map<string, number>()
    for (const { sessionId, event } of plan.events) {
      const next = (n.get(sessionId) ?? 0) + 1
      n.set(sessionId, next)
      e.push({ p: k, sid: sessionId, n: next, at: plan.at, ev: event })
    }
  })
  return JSON.stringify({ p, s, r, l, t, o, u, e, f: fence === null ? null : { n: fence.name, e: fence.epoch } })
}

/** Locks host rows in id order (`NO KEY UPDATE`, as the apply's `UPDATE` takes them). */
export const lockHostsSql = (ids: readonly string[]): SQL =>
  sql`select id from hosts where ${anyJson(sql`id`, ids)} order by id for no key update`

/** Of the plans that took room at a host version: how many were written, and how many refused for that host's change. */
const versionChecks = (plans: readonly Plan.Plan[], outcomes: readonly { readonly ok: boolean; readonly stale: boolean }[]): [number, number] => {
  let placed = 0
  let conflicts = 0
  outcomes.forEach((o, k) => {
    if (plans[k]?.host == null) return
    if (o.ok) placed++
    else if (!o.stale) conflicts++
  })
  return [placed, conflicts]
}

const applied: Plan.Outcome = { _tag: "Applied" }
const staleSession: Plan.Outcome = { _tag: "Stale", stale: "session" }
const staleHost: Plan.Outcome = { _tag: "Stale", stale: "host" }

/**
 * Applies a group of plans on `conn` (the pool: the statement commits alone; a transaction:
 * with the caller's locks) and answers what happened to each plan, in order. The host rows it
 * wrote are learned by `cache` once committed. Under a lease (`CurrentFence`) the statement
 * itself checks the lease row (`FOR SHARE`: a takeover waits for it) and writes nothing at
 * another epoch: the group is refused whole, on the pool as in a transaction.
 */
export const apply = <E>(conn: Conn<E>, cache: HostCache, plans: readonly Plan.Plan[]): Effect.Effect<readonly Plan.Outcome[], E> =>
  Effect.flatMap(Effect.service(CurrentFence), (fence) => {
    if (plans.length === 0) return Effect.succeed([])
    const bad = Plan.checkGroup(plans)
    if (bad !== null) return Effect.die(new Error(`store-pg: ${bad}`))
    const statement = applySql(docOf(plans, fence))
    const changed = [...new Set(plans.flatMap(Plan.hostsChanged))].sort()
    // Several hosts in a transaction: locked in id order first, in the same round trip.
    const run = conn.inTransaction && changed.length > 1 ? Effect.map(conn.pipeline([lockHostsSql(changed), statement]), (r) => r.at(-1) ?? []) : conn.query(statement)
    return Effect.flatMap(run, ([row]) => {
      const refused = fence === null ? null : Fence.refusal(fence, json<{ epoch: unknown } | null>(row?.["fenced"] ?? null))
      if (refused !== null) return Effect.fail(refused as E)
      const outcomes = json<{ p: number; ok: boolean; stale: boolean }[]>(row?.["outcomes"] ?? [])
      const hosts = json<Record<string, unknown>[]>(row?.["hosts"] ?? []).map(toHostRow)
      const [placed, conflicts] = versionChecks(plans, outcomes)
      conn.afterCommit(() => {
        for (const h of hosts) cache.learn(h)
        cache.checked(placed, conflicts)
      })
      return Effect.succeed(outcomes.map((o) => (o.ok ? applied : o.stale ? staleSession : staleHost)))
    })
  })
