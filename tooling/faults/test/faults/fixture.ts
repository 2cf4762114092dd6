/**
 * What every scenario shares: a fleet of hosts registered and reported over HTTP (so their
 * capacity is known and placements are gated), the capacities the host view answers, and the
 * assertion that ends each scenario: the checker finds nothing.
 */
import { expect } from "vitest"
import { Checker } from "../../src/index.js"
import type { Observation } from "../../src/Checker.js"
import type { Op } from "../../src/History.js"
import type { Capacities } from "../../src/Observe.js"

export const ADMIN_TOKEN = "faults-admin-token-0123456789abcdef"

const call = async (url: string, method: string, path: string, body?: unknown) => {
  const res = await fetch(`${url}${path}`, {
    method,
    headers: { authorization: `Bearer ${ADMIN_TOKEN}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })
  const text = await res.text()
  return { status: res.status, body: (text === "" ? null : JSON.parse(text)) as Record<string, unknown> }
}

/**
 * Registers `count` hosts named `<prefix>-<i>` and, unless `report` is false, reports each with
 * `capacityMib` of RAM after the 1024 MiB system reserve and 8 vCPUs; answers their tokens.
 */
export const registerHosts = async (url: string, prefix: string, count: number, capacityMib: number, report = true): Promise<Map<string, string>> => {
  const tokens = new Map<string, string>()
  for (let i = 0; i < count; i++) {
    const id = `${prefix}-${i}`
    const created = await call(url, "POST", "/v1/hosts", { id })
    expect(created.status, JSON.stringify(created.body)).toBe(201)
    tokens.set(id, created.body["token"] as string)
    if (report) {
      const reported = await call(url, "PUT", `/v1/hosts/${id}/report`, { totalMib: capacityMib + 1024, allocatableMib: capacityMib + 1024, totalVcpus: 8 })
      expect(reported.status, JSON.stringify(reported.body)).toBe(200)
    }
  }
  return tokens
}

/** Each host's capacity after policy and vCPU budget, as the host view answers them. */
export const capacities = async (url: string): Promise<Capacities> => {
  const hosts = await call(url, "GET", "/v1/hosts?limit=1000")
  expect(hosts.status).toBe(200)
  const items = hosts.body["items"] as { id: string; allocatableMib: number | null; cpuBudget: number | null }[]
  return new Map(items.map((h) => [h.id, { capacityMib: h.allocatableMib, cpuBudget: h.cpuBudget }]))
}

/** The scenario's end: the checker finds no violation in the history and what the store holds. */
export const expectNoViolations = (history: readonly Op[], observation: Observation): void => {
  const violations = Checker.check(history, observation)
  expect(violations, Checker.describe(violations)).toEqual([])
}

/** Counts of the history's answers by status, for a failure message. */
export const tally = (ops: readonly Op[]): string => {
  const counts = new Map<string, number>()
  for (const op of ops) counts.set(String(op.status ?? "none"), (counts.get(String(op.status ?? "none")) ?? 0) + 1)
  return [...counts].map(([s, n]) => `${s}: ${n}`).join(", ")
}
