/**
 * What the checker reads after a scenario: the store's sessions, hosts and reservations, through
 * the API (any backend) or straight from PostgreSQL (the maintained sums as the store keeps them,
 * in one snapshot), and samples of every host's reserved room taken while the load runs.
 */
import postgres from "@engram/postgres"
import type { HostSums, Observation, Sample, StoredReservation, StoredSession } from "./Checker.js"
import type { GuestLog } from "./History.js"

/* eslint-disable @typescript-eslint/no-explicit-any -- API pages are read loosely; each field read is named */
const get = async (url: string, token: string, path: string): Promise<any> => {
  const res = await fetch(`${url}${path}`, { headers: { authorization: `Bearer ${token}` }, signal: AbortSignal.timeout(30_000) })
  const body = await res.json()
  if (res.status !== 200) throw new Error(`GET ${path}: ${res.status} ${JSON.stringify(body)}`)
  return body
}

/** Every item of a paged list. */
export const listAll = async (url: string, token: string, path: string): Promise<any[]> => {
  const items: any[] = []
  for (let cursor: string | null = null; ; ) {
    const sep = path.includes("?") ? "&" : "?"
    const page = await get(url, token, `${path}${sep}limit=1000${cursor === null ? "" : `&cursor=${encodeURIComponent(cursor)}`}`)
    items.push(...page.items)
    cursor = page.nextCursor
    if (cursor === null) return items
  }
}

const hostSums = (h: any): HostSums => ({
  id: h.id,
  capacityMib: h.allocatableMib,
  cpuBudget: h.cpuBudget,
  reservedMib: h.reservedMib,
  reservedVcpus: h.reservedVcpus,
  entries: h.entries,
})
/* eslint-enable @typescript-eslint/no-explicit-any */

/** The store's state through the API (hosts' sums as the host view answers them). */
export const observeApi = async (url: string, token: string): Promise<Observation> => {
  const [sessions, hosts, reservations] = await Promise.all([listAll(url, token, "/v1/sessions"), listAll(url, token, "/v1/hosts"), listAll(url, token, "/v1/reservations")])
  return {
    sessions: sessions.map((s): StoredSession => ({ id: s.id, state: s.state, hostId: s.hostId })),
    hosts: hosts.map(hostSums),
    reservations: reservations.map((r): StoredReservation => ({ id: r.id, hostId: r.hostId, ownerKind: r.ownerKind, ownerId: r.ownerId, memMib: r.memMib, vcpus: r.vcpus })),
  }
}

/** Every host's reserved room through the API, as one sample. */
export const sampleApi = async (url: string, token: string): Promise<Sample> => ({ atMs: Date.now(), hosts: (await listAll(url, token, "/v1/hosts")).map(hostSums) })

/** The capacities after policy the host view answers (the checker compares reservations to them). */
export type Capacities = ReadonlyMap<string, { readonly capacityMib: number | null; readonly cpuBudget: number | null }>

/** Reads the store-pg tables straight from PostgreSQL, each read in one snapshot. */
export interface SqlObserver {
  /** Sessions, hosts with their maintained sums, and reservations, in one snapshot. */
  readonly observe: () => Promise<Observation>
  /** Each host's reservations summed, in one snapshot. */
  readonly sample: () => Promise<Sample>
  readonly close: () => Promise<void>
}

/** An observer of the database at `dbUrl`; `capacities` come from the host view (read once the hosts reported). */
export const sqlObserver = (dbUrl: string, capacities: Capacities): SqlObserver => {
  const sql = postgres(dbUrl, { max: 1, onnotice: () => undefined, connect_timeout: 10 })
  const cap = (id: string) => capacities.get(id) ?? { capacityMib: null, cpuBudget: null }
  const snapshot = <A>(body: (tx: postgres.TransactionSql) => Promise<A>): Promise<A> =>
    sql.begin("isolation level repeatable read read only", body) as Promise<A>
  return {
    observe: () =>
      snapshot(async (tx) => {
        const sessions = await tx<{ id: string; state: string; host_id: string | null }[]>`select id, state, host_id from sessions`
        const hosts = await tx<{ id: string; reserved_mem_mib: string; reserved_vcpus: string; entries: number }[]>`select id, reserved_mem_mib, reserved_vcpus, entries from hosts`
        const reservations = await tx<{ id: string; host_id: string; owner_kind: string; owner_id: string; mem_mib: number; vcpus: number }[]>`
          select id, host_id, owner_kind, owner_id, mem_mib, vcpus from reservations`
        return {
          sessions: sessions.map((s) => ({ id: s.id, state: s.state, hostId: s.host_id })),
          hosts: hosts.map((h) => ({ id: h.id, ...cap(h.id), reservedMib: Number(h.reserved_mem_mib), reservedVcpus: Number(h.reserved_vcpus), entries: h.entries })),
          reservations: reservations.map((r) => ({ id: r.id, hostId: r.host_id, ownerKind: r.owner_kind, ownerId: r.owner_id, memMib: Number(r.mem_mib), vcpus: Number(r.vcpus) })),
        }
      }),
    sample: () =>
      snapshot(async (tx) => {
        const rows = await tx<{ id: string; mem: string | null; vcpus: string | null; entries: string }[]>`
          select h.id, sum(r.mem_mib::numeric) as mem, sum(r.vcpus::numeric) as vcpus, count(r.id) as entries
          from hosts h left join reservations r on r.host_id = h.id group by h.id`
        return {
          atMs: Date.now(),
          hosts: rows.map((r) => ({ id: r.id, ...cap(r.id), reservedMib: Number(r.mem ?? 0), reservedVcpus: Number(r.vcpus ?? 0), entries: Number(r.entries) })),
        }
      }),
    close: () => sql.end({ timeout: 5 }),
  }
}

/** Samples with `take` every `everyMs` until stopped; a failed read (the database is away) is skipped. */
export const startSampler = (take: () => Promise<Sample>, everyMs = 250): { readonly samples: Sample[]; readonly stop: () => Promise<void> } => {
  const samples: Sample[] = []
  let stopping = false
  const loop = (async () => {
    while (!stopping) {
      try {
        samples.push(await take())
      } catch {
        // The database or the coordinator is away: no sample this time.
      }
      await new Promise((r) => setTimeout(r, everyMs))
    }
  })()
  return {
    samples,
    stop: async () => {
      stopping = true
      await loop
    },
  }
}

/** One agent the guest watcher reads: its host id and its report of the guests it holds. */
export interface WatchedAgent {
  readonly hostId: string
  readonly guests: () => Promise<readonly { readonly vmId: string; readonly status: string }[]>
}

/**
 * Reads every agent's guests every `everyMs` until stopped and records into `log` each guest an
 * agent first reports running and each guest gone from an agent's report. A read that fails or
 * takes longer than `boundMs` (the agent is stopped, killed or restarting) says nothing: only two
 * answered reads of the same agent, the later without the guest, make a destroy.
 */
export const watchGuests = (agents: () => readonly WatchedAgent[], log: GuestLog, everyMs = 200, boundMs = 1000): { readonly stop: () => Promise<void> } => {
  const held = new Map<string, Set<string>>()
  const reported = new Map<string, Set<string>>()
  let stopping = false
  const readOne = async (agent: WatchedAgent): Promise<void> => {
    const sentMs = Date.now()
    let timer: NodeJS.Timeout | undefined
    const bound = new Promise<null>((r) => (timer = setTimeout(() => r(null), boundMs)))
    const vms = await Promise.race([agent.guests().catch(() => null), bound]).finally(() => clearTimeout(timer))
    if (vms === null) return
    const answeredMs = Date.now()
    const before = held.get(agent.hostId) ?? new Set<string>()
    const seen = reported.get(agent.hostId) ?? new Set<string>()
    const now = new Set(vms.map((v) => v.vmId))
    for (const id of before) {
      if (now.has(id)) continue
      log.record({ kind: "guest_destroyed", hostId: agent.hostId, sessionId: id, atMs: answeredMs })
      seen.delete(id)
    }
    for (const v of vms) {
      if (v.status !== "running" || seen.has(v.vmId)) continue
      seen.add(v.vmId)
      log.record({ kind: "guest_running", hostId: agent.hostId, sessionId: v.vmId, atMs: sentMs })
    }
    held.set(agent.hostId, now)
    reported.set(agent.hostId, seen)
  }
  const loop = (async () => {
    while (!stopping) {
      await Promise.all(agents().map(readOne))
      await new Promise((r) => setTimeout(r, everyMs))
    }
  })()
  return {
    stop: async () => {
      stopping = true
      await loop
    },
  }
}
