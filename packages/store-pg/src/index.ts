/**
 * @engram/store-pg: the engram store on PostgreSQL (postgres.js) and on PGlite, through
 * drizzle-orm, with committed drizzle-kit migrations; and its change notices across processes
 * (`ChangesPg`: LISTEN/NOTIFY).
 */
export * as StorePg from "./StorePg.js"
export * as Lease from "./Lease.js"
export * as Blockers from "./Blockers.js"
export * as DatabaseTime from "./DatabaseTime.js"
export * as ChangesPg from "./ChangesPg.js"
export * as schema from "./schema.js"
export { migrate, migrationsFolder } from "./Migrate.js"
