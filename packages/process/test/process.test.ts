// How an engram process logs and says its start-up failures: the settings from the
// environment, the two line formats, and the one-line explanations of a failed listen and a
// refused database.
import { Cause } from "effect"
import { describe, expect, it } from "vitest"
import { Explain, Log } from "../src/index.js"

const at = new Date("2026-12-01T12:04:36.000Z")

describe("log settings", () => {
  it("pretty on a terminal, JSON lines otherwise, and ENGRAM_LOG_FORMAT wins", () => {
    expect(Log.fromEnv({}, true).settings).toMatchObject({ format: "pretty", level: "Info", colors: true })
    expect(Log.fromEnv({}, false).settings).toMatchObject({ format: "json", colors: false })
    expect(Log.fromEnv({ ENGRAM_LOG_FORMAT: "json" }, true).settings.format).toBe("json")
    expect(Log.fromEnv({ ENGRAM_LOG_FORMAT: "pretty" }, false).settings).toMatchObject({ format: "pretty", colors: false })
    expect(Log.fromEnv({ NO_COLOR: "1" }, true).settings.colors).toBe(false)
  })

  it("ENGRAM_LOG_LEVEL takes the level words; a bad value is an issue naming the variable and the rule", () => {
    expect(Log.fromEnv({ ENGRAM_LOG_LEVEL: "warn" }, false).settings.level).toBe("Warn")
    expect(Log.fromEnv({ ENGRAM_LOG_LEVEL: "DEBUG" }, false).settings.level).toBe("Debug")
    const bad = Log.fromEnv({ ENGRAM_LOG_LEVEL: "loud", ENGRAM_LOG_FORMAT: "xml" }, false)
    expect(bad.issues).toEqual([
      { variable: "ENGRAM_LOG_FORMAT", rule: "must be pretty or json", value: "xml" },
      { variable: "ENGRAM_LOG_LEVEL", rule: "must be one of trace, debug, info, warn, error, fatal, none", value: "loud" },
    ])
    expect(bad.settings.level).toBe("Info")
  })
})

describe("log lines", () => {
  const event = { level: "Info" as const, date: at, message: ["engram coordinator listening on http://127.0.0.1:7070", { port: 7070, store: "pglite" }], annotations: { replica: "a" }, cause: null }

  it("a pretty line is the time, the level, the text and key=value fields", () => {
    const line = Log.prettyLine(event, false)
    expect(line).toMatch(/^\d\d:\d\d:\d\d INFO {2}engram coordinator listening on http:\/\/127\.0\.0\.1:7070 {2}replica=a port=7070 store=pglite$/)
  })

  it("a JSON line is one object with time, level, msg and the fields", () => {
    expect(JSON.parse(Log.jsonLine(event))).toEqual({ time: at.toISOString(), level: "info", msg: "engram coordinator listening on http://127.0.0.1:7070", replica: "a", port: 7070, store: "pglite" })
    expect(Log.jsonLine({ ...event, message: "x", cause: "Error: boom" })).toContain('"cause":"Error: boom"')
  })
})

describe("start-up failures in one line", () => {
  const listenError = Object.assign(new Error("listen EADDRINUSE: address already in use 127.0.0.1:7070"), { code: "EADDRINUSE", syscall: "listen" })
  const serveError = Object.assign(new Error(""), { cause: listenError })

  it("a port in use names the port and the setting", () => {
    expect(Explain.listenFailure(Cause.fail(serveError), { host: "127.0.0.1", port: 7070, portVariable: "ENGRAM_PORT" })).toBe(
      "port 7070 on 127.0.0.1 is already in use: another engram process or program listens there. Stop it, or choose another port with ENGRAM_PORT",
    )
  })

  it("an EACCES that is not a listen (a data directory) is not read as one", () => {
    const fsError = Object.assign(new Error("EACCES: permission denied, mkdir '/data'"), { code: "EACCES", syscall: "mkdir" })
    expect(Explain.listenFailure(Cause.fail(fsError), { host: "127.0.0.1", port: 7070, portVariable: "ENGRAM_PORT" })).toBe(null)
  })

  it("a database URL of several hosts names them all, never the credentials", () => {
    expect(Explain.databaseWhere("postgres://engram:s3cret@db1:5432,db2:5433/engram?sslmode=require")).toBe("db1:5432,db2:5433/engram")
    expect(Explain.databaseWhere("postgres://engram:p%40ss@db1,db2")).toBe("db1,db2")
    expect(Explain.databaseWhere("not a url")).toBe("the configured database")
    // A password holding / or # (unescaped): never printed.
    expect(Explain.databaseWhere("postgres://engram:s3cr/t@db1:5432,db2:5432/engram")).toBe("db1:5432,db2:5432/engram")
    expect(Explain.databaseWhere("postgres://engram:p#w@db1,db2/engram")).toBe("db1,db2/engram")
  })

  it("a refused database names where (never the credentials) and the setting", () => {
    const refused = Cause.fail(new Error("store unavailable: connect ECONNREFUSED 10.0.0.5:5432"))
    expect(Explain.databaseFailure(refused, "postgres://engram:secret@10.0.0.5:5432/engram")).toBe(
      "the database at 10.0.0.5:5432/engram refused the connection (ENGRAM_DATABASE_URL): is PostgreSQL running and listening there?",
    )
    const auth = Cause.fail(new Error('store unavailable: password authentication failed for user "engram"'))
    const line = Explain.databaseFailure(auth, "postgres://engram:secret@db/engram")
    expect(line).toBe('the database at db/engram refused the credentials in ENGRAM_DATABASE_URL: password authentication failed for user "engram"')
    expect(line).not.toContain("secret")
  })

  it("anything else is its outermost and innermost messages", () => {
    expect(Explain.oneLine(Cause.fail(Object.assign(new Error("store unavailable"), { cause: new Error("disk full") })))).toBe("store unavailable: disk full")
  })
})
