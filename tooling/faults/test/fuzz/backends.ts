// The coordinators the fuzzers run against: on the embedded PGlite store and on PostgreSQL.
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { freshDatabase, type TestDatabase } from "@engram/test-pg"
import { killAll, tempDir } from "../../src/Processes.js"

/**
 * A list's answer as a "changes nothing" snapshot compares it: a host's `silent` left out. It is
 * judged at the read's time (the host's last report against the stale window), so it turns true
 * by itself once a run outlasts the window since its set-up's reports (a CI run at load 20 took
 * 115 s on PGlite), not by a request.
 */
export const unjudged = (path: string, body: unknown): unknown => {
  const items = (body as { items?: unknown } | null)?.items
  if (!path.startsWith("/v1/hosts") || !Array.isArray(items)) return body
  return { ...(body as object), items: items.map((h: Record<string, unknown>) => Object.fromEntries(Object.entries(h).filter(([k]) => k !== "silent"))) }
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
 * session, the park gate's descent for a session that queued, a timed-out move's abort), which
 * under a loaded CI machine landed between the snapshot before a 4xx and the one after it.
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
