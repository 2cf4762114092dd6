// The PGlite worker (`Pglite.open({ worker: true })`): PGlite's engine in a thread of its own, so
// that its statements run beside the process's event loop (HTTP, Effect) instead of taking turns
// with it. Plain JavaScript, shipped as is: the thread loads it from disk in every setting (the
// sources, the built package, a test runner). It answers each message in order:
//   { id, op: "query", sql, params, rowMode } → { id, ok: true, result: { rows, fields, affectedRows } }
//   { id, op: "exec", sql }                  → { id, ok: true, result: null }
//   { id, op: "close" }                      → { id, ok: true, result: null } (PGlite closed)
// and a failure as { id, ok: false, error: { message, code, constraint, detail, name } }.
import { parentPort, workerData } from "node:worker_threads"
import { PGlite, types } from "@electric-sql/pglite"
import { drizzle } from "drizzle-orm/pglite"
import { migrate } from "drizzle-orm/pglite/migrator"

// The parsers drizzle's PGlite session gives every query: dates, times and intervals as PGlite's
// text (drizzle maps them), so rows read here equal rows read in the process.
const identity = (value) => value
const parsers = {
  [types.TIMESTAMP]: identity,
  [types.TIMESTAMPTZ]: identity,
  [types.INTERVAL]: identity,
  [types.DATE]: identity,
  1231: identity,
  1115: identity,
  1185: identity,
  1187: identity,
  1182: identity,
}

const errorOf = (e) => ({
  message: e instanceof Error ? e.message : String(e),
  name: e instanceof Error ? e.name : "Error",
  code: typeof e?.code === "string" ? e.code : undefined,
  constraint: typeof e?.constraint === "string" ? e.constraint : undefined,
  detail: typeof e?.detail === "string" ? e.detail : undefined,
})

let client
// Opening first, then every message, one at a time in arrival order: PGlite has one connection,
// and a transaction's statements must follow its BEGIN. (No top-level await: the executable's
// build bundles this file as CommonJS.)
let chain = (async () => {
  try {
    client = workerData.dataDir === undefined ? new PGlite() : new PGlite(workerData.dataDir)
    await client.waitReady
    await migrate(drizzle({ client }), { migrationsFolder: workerData.migrationsFolder })
    parentPort.postMessage({ id: 0, ok: true, result: null })
  } catch (e) {
    parentPort.postMessage({ id: 0, ok: false, error: errorOf(e) })
  }
})()
parentPort.on("message", (m) => {
  chain = chain.then(async () => {
    try {
      let result = null
      if (m.op === "query") {
        const r = await client.query(m.sql, m.params, { rowMode: m.rowMode, parsers })
        result = { rows: r.rows, fields: r.fields, affectedRows: r.affectedRows }
      } else if (m.op === "exec") await client.exec(m.sql)
      else if (m.op === "close") {
        if (!client.closed) await client.close()
      }
      parentPort.postMessage({ id: m.id, ok: true, result })
    } catch (e) {
      parentPort.postMessage({ id: m.id, ok: false, error: errorOf(e) })
    }
  })
})
