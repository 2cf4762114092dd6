// Three coordinator processes on one PostgreSQL: 2,000 concurrent creates spread over them never
// over-commit a host, every session is placed or queued once, exactly one replica reaps; when
// the leader is frozen (SIGSTOP) another takes over once the lease ran out and reaps, and the
// woken one stands down; when the leader is killed another takes over the same way.
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { startChild } from "./support/child.js"
import type { ChildCoordinator } from "./support/child.js"
import { client, listAll } from "./support/http.js"

const adminToken = "replicas-admin-token-0123456789"
const intervalMs = 500
const leaseMs = 1500
const renewDeadlineMs = 1000
/** A replica looks at the lease every third of the renew deadline (Leader.leaseRetryMs). */
const retryMs = Math.floor(renewDeadlineMs / 3)
/** The lease checks a survivor may take to lead: a whole lease unchanged, and two more looks. */
const takeoverChecks = Math.ceil(leaseMs / retryMs) + 2

/** A replica's leadership and how many reaper ticks it has run, from one scrape (null: killed). */
const leadership = async (url: string): Promise<{ leading: boolean; checks: number; unrenewedS: number } | null> => {
  try {
    // Bounded: a frozen replica answers nothing.
    const res = await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${adminToken}` }, signal: AbortSignal.timeout(1000) })
    const text = await res.text()
    const leading = /^engram_reaper_leader (\d+)$/m.exec(text)?.[1]
    const checks = /^engram_reaper_leader_checks_total (\d+)$/m.exec(text)?.[1]
    const unrenewed = /^engram_lease_unrenewed_seconds (\S+)$/m.exec(text)?.[1]
    return leading === undefined || checks === undefined || unrenewed === undefined
      ? null
      : { leading: leading === "1", checks: Number(checks), unrenewedS: Number(unrenewed) }
  } catch {
    return null // a killed replica
  }
}
const leaderGauge = async (url: string): Promise<number | null> => {
  const l = await leadership(url)
  return l === null ? null : l.leading ? 1 : 0
}

/**
 * The replicas' leader gauges once every one answers and exactly one leads (read every 100 ms, up
 * to a minute; as last read if that never holds): a replica that has not yet ticked, or a scrape
 * slower than its bound on a loaded machine, is waited out rather than read as a wrong count.
 */
const settledGauges = async (urls: readonly string[]): Promise<(number | null)[]> => {
  let gauges: (number | null)[] = []
  for (const deadline = Date.now() + 60_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 100))) {
    gauges = await Promise.all(urls.map(leaderGauge))
    if (gauges.every((g) => g !== null) && gauges.filter((g) => g === 1).length === 1) break
  }
  return gauges
}

/** Runs `tasks` with at most `limit` in flight. */
const bounded = async <T>(n: number, limit: number, task: (i: number) => Promise<T>): Promise<T[]> => {
  const out: T[] = new Array(n)
  let next = 0
  await Promise.all(
    Array.from({ length: limit }, async () => {
      while (next < n) {
        const i = next++
        out[i] = await task(i)
      }
    }),
  )
  return out
}

describe("three replicas on one PostgreSQL", () => {
  let db: TestDatabase
  let dataDir: string
  const replicas: ChildCoordinator[] = []
  beforeAll(async () => {
    db = await freshDatabase()
    dataDir = mkdtempSync(join(tmpdir(), "engram-replicas-"))
    const env = {
      ENGRAM_DATABASE_URL: db.url,
      ENGRAM_ADMIN_TOKEN: adminToken,
      ENGRAM_REAPER_INTERVAL_MS: String(intervalMs),
      ENGRAM_LEASE_DURATION_MS: String(leaseMs),
      ENGRAM_LEASE_RENEW_DEADLINE_MS: String(renewDeadlineMs),
      ENGRAM_DATA_DIR: dataDir,
      // The failover grace is the default (the stale window, 2 min): a new leader reclaims an
      // expired reservation during it; only stale ones wait.
    }
    // The first applies the migrations; the others start beside it.
    replicas.push(await startChild(env))
    replicas.push(...(await Promise.all([startChild(env), startChild(env)])))
  })
  afterAll(async () => {
    for (const r of replicas) if (r.process.exitCode === null && r.process.signalCode === null) r.process.kill("SIGTERM")
    await Promise.all(replicas.map((r) => r.exited))
    await db?.drop()
    rmSync(dataDir, { recursive: true, force: true })
  })

  it("a frozen leader (SIGSTOP) is replaced once its lease ran out; the new leader reclaims an expired reservation; woken, the old one stands down", async () => {
    const gauges = await settledGauges(replicas.map((r) => r.url))
    expect(gauges.filter((g) => g === 1)).toHaveLength(1)
    const frozen = replicas[gauges.indexOf(1)]!
    const others = replicas.filter((r) => r !== frozen)
    const admin = client(others[0]!.url, adminToken)
    expect((await admin.post("/v1/hosts", { id: "frozen-h" })).status).toBe(201)
    expect((await admin.put("/v1/hosts/frozen-h/report", { totalMib: 4096, allocatableMib: 4096, totalVcpus: 4 })).status).toBe(200)
    frozen.process.kill("SIGSTOP")
    try {
      // Made while the leader is frozen, expiring at once: only a new leader can reclaim it.
      const expiresAt = Date.now() + 300
      const reserved = await admin.post("/v1/reservations", { id: "frozen-r", hostId: "frozen-h", ownerKind: "external", ownerId: "x", memMib: 256, vcpus: 1, expiresAt })
      expect(reserved.status, JSON.stringify(reserved.body)).toBe(201)
      const atFreeze = await Promise.all(others.map((r) => leadership(r.url)))
      let tookOver: { checks: number; unrenewedS: number } | null = null
      while (tookOver === null) {
        const now = await Promise.all(others.map((r) => leadership(r.url)))
        const i = now.findIndex((l) => l?.leading === true)
        if (i >= 0) tookOver = { checks: now[i]!.checks - atFreeze[i]!.checks, unrenewedS: now[i]!.unrenewedS }
        else if (now.every((l, k) => l !== null && l.checks - atFreeze[k]!.checks > takeoverChecks)) break
        else await new Promise((r) => setTimeout(r, 25))
      }
      console.log(`replicas: leader frozen; takeover after ${tookOver?.checks} lease checks of the new leader (lease ${leaseMs} ms, every ${retryMs} ms)`)
      expect(tookOver, `no survivor led within ${takeoverChecks} of its lease checks after the freeze`).not.toBeNull()
      // A leader saw its own renewal at its last lease check (within its renew deadline, or it would not lead).
      expect(tookOver!.unrenewedS).toBeLessThan(renewDeadlineMs / 1000)
      // The new leader's passes reclaim the expired reservation at once, within their failover grace (the frozen one's lease is gone).
      let gone = false
      for (let i = 0; i < 200 && !gone; i++) {
        gone = (await admin.get("/v1/reservations/frozen-r")).status === 404
        if (!gone) await new Promise((r) => setTimeout(r, 50))
      }
      expect(gone, "the expired reservation was not reclaimed while the leader was frozen").toBe(true)
    } finally {
      frozen.process.kill("SIGCONT")
    }
    // Woken, the old leader finds its lease taken: it stands down; still exactly one leader.
    let woken = await leadership(frozen.url)
    for (let i = 0; i < 200 && woken?.leading !== false; i++) {
      await new Promise((r) => setTimeout(r, 25))
      woken = await leadership(frozen.url)
    }
    expect(woken?.leading).toBe(false)
    const after = await settledGauges(replicas.map((r) => r.url))
    expect(after.filter((g) => g === 1)).toHaveLength(1)
    expect((await admin.del("/v1/hosts/frozen-h")).status).toBe(200)
  })

  it("2,000 concurrent creates: no host over capacity, every session placed or queued exactly once", async () => {
    const admin = client(replicas[0]!.url, adminToken)
    const hostCount = 24
    for (let h = 0; h < hostCount; h++) {
      const id = `r-h${String(h).padStart(2, "0")}`
      expect((await admin.post("/v1/hosts", { id })).status).toBe(201)
      // Capacity after policy 8,192 MiB, 16 vCPUs → cpuBudget 64.
      expect((await admin.put(`/v1/hosts/${id}/report`, { totalMib: 12288, allocatableMib: 9216, totalVcpus: 16 })).status).toBe(200)
    }
    const total = 2000
    const t0 = performance.now()
    const answers = await bounded(total, 64, async (i) => {
      const replica = replicas[i % replicas.length]!
      const memMib = 128 * (1 + (i % 8)) // 128..1024
      const r = await client(replica.url, adminToken).post("/v1/sessions", { id: `r-s${i}`, memMib, vcpus: 1 + (i % 3) })
      return r.status
    })
    const seconds = (performance.now() - t0) / 1000
    console.log(`replicas: ${total} creates over 3 replicas in ${seconds.toFixed(1)} s (${(total / seconds).toFixed(0)}/s)`)
    expect(answers.filter((s) => s !== 201 && s !== 202)).toEqual([])

    const hosts = await listAll<{ id: string; allocatableMib: number; reservedMib: number; cpuBudget: number; reservedVcpus: number; entries: number }>(admin, "/v1/hosts")
    for (const h of hosts) {
      expect(h.reservedMib, h.id).toBeLessThanOrEqual(h.allocatableMib)
      expect(h.reservedVcpus, h.id).toBeLessThanOrEqual(h.cpuBudget)
      expect(h.entries, h.id).toBeLessThanOrEqual(32)
    }
    const sessions = await listAll<{ id: string; state: string; hostId: string | null; budget: { memMib: number } }>(admin, "/v1/sessions")
    const ours = sessions.filter((s) => s.id.startsWith("r-s"))
    expect(ours).toHaveLength(total)
    expect(new Set(ours.map((s) => s.id)).size).toBe(total)
    for (const s of ours) expect(["pending", "queued"]).toContain(s.state)
    // The ledger agrees with the sessions: every placed session holds exactly its budget on its host.
    const placedMib = new Map<string, number>()
    for (const s of ours) if (s.hostId !== null) placedMib.set(s.hostId, (placedMib.get(s.hostId) ?? 0) + s.budget.memMib)
    for (const h of hosts) expect(h.reservedMib, h.id).toBe(placedMib.get(h.id) ?? 0)
    expect(answers.filter((s) => s === 201).length).toBe(ours.filter((s) => s.state === "pending").length)
    // Each replica counts the version checks of its own placements: together at least every create placed.
    let written = 0
    for (const r of replicas) {
      const text = await (await fetch(`${r.url}/metrics`, { headers: { authorization: `Bearer ${adminToken}` } })).text()
      expect(text).toMatch(/^engram_placement_conflicts_total \d+$/m)
      written += Number(/^engram_placement_writes_total (\d+)$/m.exec(text)?.[1])
    }
    expect(written).toBeGreaterThanOrEqual(answers.filter((s) => s === 201).length)
  }, 300_000)

  it("exactly one reaper leader; SIGKILL it and another takes over once its lease ran out", async () => {
    const gauges = await settledGauges(replicas.map((r) => r.url))
    expect(gauges.filter((g) => g === 1)).toHaveLength(1)
    expect(gauges.filter((g) => g === 0)).toHaveLength(2)
    const leader = replicas[gauges.indexOf(1)]!
    const others = replicas.filter((r) => r !== leader)

    // Counted in the survivors' own reaper ticks, not in wall time (a loaded machine stretches
    // both alike): one of them leads within two of its ticks after the kill.
    leader.process.kill("SIGKILL")
    const atKill = await Promise.all(others.map((r) => leadership(r.url)))
    let tookOver: { ticks: number } | null = null
    while (tookOver === null) {
      const now = await Promise.all(others.map((r) => leadership(r.url)))
      const i = now.findIndex((l) => l?.leading === true)
      if (i >= 0) tookOver = { ticks: now[i]!.checks - atKill[i]!.checks }
      else if (now.every((l, k) => l !== null && l.checks - atKill[k]!.checks > takeoverChecks)) break
      else await new Promise((r) => setTimeout(r, 25))
    }
    console.log(`replicas: leader killed; takeover after ${tookOver?.ticks} lease checks of the new leader (lease ${leaseMs} ms, every ${retryMs} ms)`)
    expect(tookOver, `no survivor led within ${takeoverChecks} of its lease checks after the kill`).not.toBeNull()
    expect(tookOver!.ticks).toBeLessThanOrEqual(takeoverChecks)
    // Still exactly one.
    const after = await settledGauges(others.map((r) => r.url))
    expect(after.filter((g) => g === 1)).toHaveLength(1)

    // A graceful stop gives the lease up at once, and the last replica leads.
    const next = others[after.indexOf(1)]!
    const last = others.find((r) => r !== next)!
    next.process.kill("SIGTERM")
    expect(await next.exited).toBe(0)
    const stoppedAt = await leadership(last.url)
    let l = stoppedAt
    while (l !== null && !l.leading && l.checks - stoppedAt!.checks <= 2) {
      await new Promise((r) => setTimeout(r, 25))
      l = await leadership(last.url)
    }
    expect(l?.leading, "the last replica did not lead within two of its ticks after the graceful stop").toBe(true)
  })
})
