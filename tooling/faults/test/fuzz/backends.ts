// The coordinators the fuzzers run against: on the embedded PGlite store and on PostgreSQL.
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { freshDatabase, type TestDatabase } from "@engram/test-pg"
import { killAll, tempDir } from "../../src/Processes.js"

/**
 * A list's answer as a "changes nothing" snapshot compares it: what is judged at the read's time
 * left out. A host's `silent` (its last report against the stale window) turns true by itself
 * once a run outlasts the window since its set-up's reports (a CI run at load 20 took 115 s on
 * PGlite), and with it the `reason` of a queued session's `noFit` entry for that host (it reads
 * "silent"): two CI runs failed at 118 and 119 s into the run, on a 401 and a 403. Neither is
 * changed by a request. The entries' figures (from the store's host cache, which no other list
 * shows) and `tooBig` (judged without the clock) stay compared.
 */
export const unjudged = (path: string, body: unknown): unknown => {
  const items = (body as { items?: unknown } | null)?.items
  if (!Array.isArray(items)) return body
  if (path.startsWith("/v1/hosts")) {
    return { ...(body as object), items: items.map((h: Record<string, unknown>) => Object.fromEntries(Object.entries(h).filter(([k]) => k !== "silent"))) }
  }
  if (path.startsWith("/v1/queue")) {
    return {
      ...(body as object),
      items: items.map((q: Record<string, unknown>) => {
        const standing = q["queue"] as { noFit?: unknown } | null | undefined
        if (standing === null || standing === undefined || !Array.isArray(standing.noFit)) return q
        const noFit = standing.noFit.map((e: Record<string, unknown>) => Object.fromEntries(Object.entries(e).filter(([k]) => k !== "reason")))
        return { ...q, queue: { ...standing, noFit } }
      }),
    }
  }
  return body
}

/** A backend: how to start a coordinator on it, and how to clean up after. */
export interface Backend {
  readonly name: string
  readonly start: (adminToken: string) => Promise<{ c: RunningCoordinator; done: () => Promise<void> }>
}

export const backends: readonly Backend[] = [
  {
    name: "PGlite",
    start: async (adminToken) => {
      const dataDir = tempDir("fuzz-pglite")
      const c = await startCoordinator({ reaper: false, logLevel: "None", config: { port: 0, adminToken, dataDir, moveTimeoutMs: 1000 } })
      return { c, done: killAll }
    },
  },
  {
    name: "PostgreSQL",
    start: async (adminToken) => {
      const db: TestDatabase = await freshDatabase({ prefix: "faults_fuzz" })
      const dataDir = tempDir("fuzz-pg")
      const c = await startCoordinator({ reaper: false, logLevel: "None", config: { port: 0, adminToken, dataDir, databaseUrl: db.url, moveTimeoutMs: 1000 } })
      return { c, done: () => db.drop().then(killAll) }
    },
  },
]

/**
 * `read` once two reads 250 ms apart agree (at most 40 reads): the state a "changes nothing"
 * check starts from. A 2xx may leave work running after its answer (a drain that places a queued
 * session, the park gate's descent for a session that queued): the check starts once it landed,
 * so that the 4xx after it is not blamed for it.
 */
export const settled = async (read: () => Promise<string>): Promise<string> => {
  let last = await read()
  for (let i = 0; i < 40; i++) {
    await new Promise((resolve) => setTimeout(resolve, 250))
    const next = await read()
    if (next === last) return next
    last = next
  }
  return last
}
