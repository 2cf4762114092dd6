// Replicas on one PostgreSQL must share ENGRAM_ADMIN_TOKEN: the leader writes a fingerprint of
// its admin token with the lease (never the token), and a replica whose own differs logs an
// error naming the variable; one whose token matches says nothing. It warns, never refuses (a
// rotation restarts the replicas one by one), and /readyz answers whether it matches.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { freshDatabase } from "@engram/test-pg"
import { mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "vitest"
import { logged } from "./support/http.js"

const tokenA = "admintoken-replica-a-0123456789"
const tokenB = "admintoken-replica-b-0123456789"

/** The replica's lease checks so far (`engram_reaper_leader_checks_total`) and whether it leads. */
const lease = async (c: RunningCoordinator, token: string): Promise<{ checks: number; leading: boolean }> => {
  const text = await (await fetch(`${c.url}/metrics`, { headers: { authorization: `Bearer ${token}` } })).text()
  return { checks: Number(/^engram_reaper_leader_checks_total (\d+)$/m.exec(text)?.[1] ?? 0), leading: /^engram_reaper_leader 1$/m.test(text) }
}

/** Polls `f` until it holds, at most `tries` times (each a round trip to a replica). */
const until = async (f: () => Promise<boolean>, tries = 400): Promise<void> => {
  for (let i = 0; i < tries; i++) if (await f()) return
  throw new Error("never held")
}

describe("replicas on one PostgreSQL and their admin tokens", () => {
  it("a replica whose admin token differs from the leader's logs an error naming ENGRAM_ADMIN_TOKEN; one that matches does not; no token is logged", async () => {
    const db = await freshDatabase()
    const started: RunningCoordinator[] = []
    const start = (adminToken: string) =>
      startCoordinator({
        logLevel: "Info",
        config: { port: 0, databaseUrl: db.url, adminToken, dataDir: join(mkdtempSync(join(tmpdir(), "engram-admintoken-")), "data"), leaseDurationMs: 1500, leaseRenewDeadlineMs: 1000 },
      }).then((c) => (started.push(c), c))
    try {
      const { lines } = await logged(async () => {
        const a = await start(tokenA)
        await until(async () => (await lease(a, tokenA)).leading)
        const same = await start(tokenA)
        await until(async () => (await lease(same, tokenA)).checks >= 3)
        const other = await start(tokenB)
        await until(async () => (await lease(other, tokenB)).checks >= 3)
        // /readyz says it too, and stays ready (a rotation passes through a mismatch).
        const ready = async (c: RunningCoordinator) => (await (await fetch(`${c.url}/readyz`)).json()) as Record<string, unknown>
        expect(await ready(other)).toMatchObject({ ok: true, leader: false, adminTokenMatchesLeader: false })
        expect(await ready(same)).toMatchObject({ ok: true, leader: false, adminTokenMatchesLeader: true })
        expect(await ready(a)).toEqual({ ok: true, store: "postgres", leader: true })
      })
      const errors = lines
        .split("\n")
        .filter((l) => l.includes("admin token differs"))
        .map((l) => JSON.parse(l) as { level: string; msg: string })
      // One: the replica with token B. The one with the leader's token ran its checks before it and logged none.
      expect(errors).toHaveLength(1)
      expect(errors[0]?.level).toBe("error")
      expect(errors[0]?.msg).toContain("Start every replica on this database with the same ENGRAM_ADMIN_TOKEN")
      expect(lines).not.toContain(tokenA)
      expect(lines).not.toContain(tokenB)
    } finally {
      for (const c of started) await c.stop()
      await db.drop()
    }
  }, 120_000)
})
