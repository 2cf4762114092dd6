// @engram/test-pg: a real PostgreSQL for tests and benchmarks.
//
//   globalSetup      "@engram/test-pg/global-setup": one server per vitest run
//   freshDatabase()  a database of its own for a test file
//   startEmbeddedPostgres()  a throwaway server for benchmarks and scripts
//   pgBinDir()       where psql, pgbench, ... are
//   startCuttableProxy()  a TCP proxy a fault test can cut
export { default as globalSetup } from "./global-setup.js"
export { createDatabase, databaseUrl, freshDatabase, testServerUrl } from "./database.js"
export type { CreateDatabaseOptions, TestDatabase } from "./database.js"
export { freePort, reapStaleServers, startEmbeddedPostgres, TEMP_DIR_PREFIX } from "./embedded.js"
export type { EmbeddedPostgresServer, StartEmbeddedPostgresOptions } from "./embedded.js"
export { embeddedPgBinDir, pgBinDir } from "./bin-dir.js"
export type { PgBinDirOptions } from "./bin-dir.js"
export { EXTERNAL_URL_ENV, PROVIDE_KEY, SERVER_URL_ENV } from "./provided.js"
export { startCuttableProxy, startProxyFor } from "./proxy.js"
export type { CuttableProxy } from "./proxy.js"
