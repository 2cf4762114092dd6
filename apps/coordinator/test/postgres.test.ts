// The end-to-end suite on a real PostgreSQL (@engram/test-pg), leader lock included.
import { startCoordinator } from "@engram/coordinator"
import { freshDatabase } from "@engram/test-pg"
import type { TestDatabase } from "@engram/test-pg"
import { afterAll } from "vitest"
import { apiSuite } from "./suite.js"

const databases: TestDatabase[] = []
afterAll(async () => {
  for (const d of databases) await d.drop()
})

apiSuite("PostgreSQL", {
  start: async (o) => {
    const db = await freshDatabase()
    databases.push(db)
    return startCoordinator({
      reaper: false,
      logLevel: "Warn",
      config: {
        port: 0,
        databaseUrl: db.url,
        adminToken: "postgres-admin-token-0123456789",
        ...(o?.moveTimeoutMs === undefined ? {} : { moveTimeoutMs: o.moveTimeoutMs }),
      },
    })
  },
})
