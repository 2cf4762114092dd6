// The HTTP server's connections (Connections): the open-connections gauge, and the cap
// (ENGRAM_MAX_CONNECTIONS) past which Node closes a connection as soon as it accepts it, each
// refusal counted and warned about at most once a minute. Real sockets against a coordinator,
// then a bare node:http server with an injected clock for the once-a-minute rule.
import { Config, Metrics, startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Env } from "@engram/process"
import { StoreSim } from "@engram/store-sim"
import { Effect, Exit } from "effect"
import { createServer, request as httpRequest } from "node:http"
import type { Server } from "node:http"
import { mkdtempSync, writeFileSync } from "node:fs"
import { connect } from "node:net"
import type { Socket } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterEach, describe, expect, it, vi } from "vitest"
import * as Connections from "../src/Connections.js"

const adminToken = "connections-admin-token-0123456789"

/** A raw connection that sends nothing, with a promise of its close. */
const open = (url: string): { readonly socket: Socket; readonly closed: Promise<void> } => {
  const { hostname, port } = new URL(url)
  const socket = connect({ host: hostname, port: Number(port) })
  socket.on("error", () => undefined)
  return { socket, closed: new Promise<void>((resolve) => socket.once("close", () => resolve())) }
}

/** A GET on a connection of its own, closed after the answer (no kept-alive socket left behind). */
const get = (url: string, path: string, token?: string): Promise<{ readonly status: number; readonly body: string }> =>
  new Promise((resolve, reject) => {
    const req = httpRequest(`${url}${path}`, { agent: false, headers: token === undefined ? {} : { authorization: `Bearer ${token}` } }, (res) => {
      let body = ""
      res.on("data", (c: Buffer) => (body += c.toString()))
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }))
    })
    req.on("error", reject)
    req.end()
  })

const gauge = (c: RunningCoordinator) => c.run(Effect.map(Effect.service(Metrics), (m) => m.connectionsOpen.get()))
const refused = (c: RunningCoordinator) => c.run(Effect.map(Effect.service(Metrics), (m) => m.connectionsRefused.get()))
const exposed = (text: string, name: string) => Number(new RegExp(`^${name} (\\d+)$`, "m").exec(text)?.[1])

/** The coordinator's log lines (stdout) while the test runs. */
const captureLines = () => {
  const lines: string[] = []
  const spy = vi.spyOn(process.stdout, "write").mockImplementation((chunk: string | Uint8Array) => {
    lines.push(...(typeof chunk === "string" ? chunk : Buffer.from(chunk).toString()).split("\n").filter((l) => l !== ""))
    return true
  })
  return { lines, restore: () => spy.mockRestore() }
}

const running: RunningCoordinator[] = []
const sockets: Socket[] = []
afterEach(async () => {
  for (const s of sockets.splice(0)) s.destroy()
  await Promise.all(running.splice(0).map((c) => c.stop()))
})
const start = async (config: { readonly maxConnections?: number } = {}, logLevel: "None" | "Warn" = "None") => {
  const c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel, config: { port: 0, adminToken, ...config } })
  running.push(c)
  return c
}
const connection = (url: string) => {
  const c = open(url)
  sockets.push(c.socket)
  return c
}

describe("engram_http_connections_open", () => {
  it("is the HTTP server's open connections now: up as raw connections open, the scrape's own counted, down as they close", async () => {
    const c = await start()
    const before = await gauge(c)
    const held = [connection(c.url), connection(c.url), connection(c.url)]
    await vi.waitFor(async () => expect(await gauge(c)).toBe(before + 3), { timeout: 30_000, interval: 10 })
    const scrape = await get(c.url, "/metrics", adminToken)
    expect(scrape.status).toBe(200)
    expect(scrape.body).toContain("# HELP engram_http_connections_open ")
    expect(exposed(scrape.body, "engram_http_connections_open")).toBe(before + 4)
    expect(exposed(scrape.body, "engram_http_connections_refused_total")).toBe(0)
    for (const h of held) h.socket.destroy()
    await vi.waitFor(async () => expect(await gauge(c)).toBe(before), { timeout: 30_000, interval: 10 })
  })
})

describe("the connection cap (ENGRAM_MAX_CONNECTIONS)", () => {
  it("past it a connection is closed at once, counted, and warned about once naming the cap and the setting; once one closes, another is served", async () => {
    const c = await start({ maxConnections: 2 }, "Warn")
    const capture = captureLines()
    try {
      const [a] = [connection(c.url), connection(c.url)]
      await vi.waitFor(async () => expect(await gauge(c)).toBe(2), { timeout: 30_000, interval: 10 })
      // Past the cap: closed by the server, though it sent nothing and the client closed nothing.
      await connection(c.url).closed
      await connection(c.url).closed
      expect(await refused(c)).toBe(2)
      expect(await gauge(c)).toBe(2)
      await vi.waitFor(() => expect(capture.lines.filter((l) => l.includes("ENGRAM_MAX_CONNECTIONS"))).toHaveLength(1), { timeout: 30_000, interval: 10 })
      // Once a minute at most: the second refusal, a moment later, is counted, not logged.
      const warning = capture.lines.find((l) => l.includes("ENGRAM_MAX_CONNECTIONS")) ?? ""
      expect(warning).toContain("refused 1 connection: this coordinator already holds its cap of 2 open connections (ENGRAM_MAX_CONNECTIONS)")
      expect(warning).toContain("engram_http_connections_refused_total")
      a?.socket.destroy()
      await vi.waitFor(async () => expect(await gauge(c)).toBe(1), { timeout: 30_000, interval: 10 })
      const scrape = await get(c.url, "/metrics", adminToken)
      expect(scrape.status).toBe(200)
      expect(exposed(scrape.body, "engram_http_connections_refused_total")).toBe(2)
      expect(exposed(scrape.body, "engram_http_connections_open")).toBe(2)
    } finally {
      capture.restore()
    }
  })

  it("is 0 (no cap) by default, an integer from 0 to 1000000; anything else is refused naming the variable and the rule", async () => {
    const byDefault = Config.parse({})
    expect(byDefault._tag === "Valid" && byDefault.config.maxConnections).toBe(0)
    const set = Config.parse({ ENGRAM_MAX_CONNECTIONS: "30000" })
    expect(set._tag === "Valid" && set.config.maxConnections).toBe(30_000)
    for (const bad of ["-1", "1000001", "1.5", "lots", "0x10"]) {
      const r = Config.parse({ ENGRAM_MAX_CONNECTIONS: bad })
      expect(r._tag === "Invalid" && r.issues.map((i) => [i.variable, i.rule])).toEqual([["ENGRAM_MAX_CONNECTIONS", "must be an integer from 0 to 1000000"]])
    }
    const exit = await Effect.runPromiseExit(Config.fromEnvironment({ ENGRAM_MAX_CONNECTIONS: "lots" }))
    const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: { message: string } }).error : undefined
    expect(error?.message).toBe(['invalid coordinator configuration:', '  ENGRAM_MAX_CONNECTIONS="lots": must be an integer from 0 to 1000000'].join("\n"))
    // A program's settings: named by key.
    const input = Config.parseInput({ maxConnections: -1 })
    expect(input._tag === "Invalid" && input.issues.map((i) => [i.variable, i.rule])).toEqual([["maxConnections", "must be an integer from 0 to 1000000"]])
    expect(Env.knownVariables.has("ENGRAM_MAX_CONNECTIONS")).toBe(true)
  })

  it("a cap within 256 of the file-descriptor limit is warned about at start, naming the limit (ulimit -n): it leaves the store too few, and at the limit connections are closed unseen", async () => {
    const dir = mkdtempSync(join(tmpdir(), "engram-limits-"))
    const limits = join(dir, "limits")
    writeFileSync(limits, "Limit                     Soft Limit           Hard Limit           Units     \nMax processes             63704                63704                processes \nMax open files            20000                524288               files     \n")
    expect(Connections.readFdLimit(limits)).toBe(20_000)
    expect(Connections.readFdLimit(join(dir, "absent"))).toBeUndefined()
    expect(Connections.fdLimitWarning(0, 20_000)).toBeUndefined()
    expect(Connections.fdLimitWarning(20_000 - Connections.fdHeadroom, 20_000)).toBeUndefined()
    expect(Connections.fdLimitWarning(20_000, undefined)).toBeUndefined()
    expect(Connections.fdLimitWarning(20_000, 20_000)).toMatch(/^ENGRAM_MAX_CONNECTIONS \(20000\) is within 256 of this process's file-descriptor limit \(ulimit -n: 20000\)/)
    // Below the limit but without room for the store's descriptors: warned too.
    expect(Connections.fdLimitWarning(20_000 - Connections.fdHeadroom + 1, 20_000)).toMatch(/is within 256 of/)
    const fdLimit = Connections.readFdLimit()
    if (fdLimit === undefined || fdLimit > 1_000_000) return // not Linux, or a limit no cap reaches
    const capture = captureLines()
    try {
      await start({ maxConnections: fdLimit }, "Warn")
      expect(capture.lines.filter((l) => l.includes(`ulimit -n: ${fdLimit}`))).toHaveLength(1)
    } finally {
      capture.restore()
    }
  })
})

describe("Connections.track on a node:http server", () => {
  let server: Server | undefined
  afterEach(async () => {
    for (const s of sockets.splice(0)) s.destroy()
    await new Promise<void>((resolve) => (server === undefined ? resolve() : server.close(() => resolve())))
    server = undefined
  })

  it("warns at most once a minute: the first refusal at once, those held back within the minute in one line at its end, whether or not another comes", async () => {
    let now = 0
    const warnings: string[] = []
    let counted = 0
    let openNow = 0
    const due: { run: () => void; ms: number }[] = []
    const cancelled: number[] = []
    server = Connections.track(createServer(), {
      maxConnections: 1,
      open: (n) => (openNow = n),
      refused: () => void counted++,
      warn: (message) => void warnings.push(message),
      now: () => now,
      schedule: (run, ms) => {
        const k = due.push({ run, ms }) - 1
        return () => void cancelled.push(k)
      },
    })
    const listening = server
    await new Promise<void>((resolve) => listening.listen(0, "127.0.0.1", () => resolve()))
    const url = `http://127.0.0.1:${(listening.address() as { port: number }).port}`
    connection(url)
    await vi.waitFor(() => expect(openNow).toBe(1), { timeout: 30_000, interval: 10 })
    await connection(url).closed
    expect(due).toEqual([])
    now = 1_000
    await connection(url).closed
    now = Connections.warnEveryMs - 1
    await connection(url).closed
    // Two held back: one line due at the minute's end (59 s after the second refusal), not two.
    expect([counted, warnings.length, due.map((d) => d.ms)]).toEqual([3, 1, [Connections.warnEveryMs - 1_000]])
    // The minute ends with no further refusal: the held-back ones are said.
    now = Connections.warnEveryMs
    due[0]!.run()
    expect(warnings).toEqual([Connections.refusedWarning(1, 1), Connections.refusedWarning(1, 2)])
    expect(warnings[1]).toMatch(/^refused 2 connections: this coordinator already holds its cap of 1 open connections/)
    // Another within the next minute: held back again, said at its end.
    now = Connections.warnEveryMs + 5_000
    await connection(url).closed
    expect([counted, warnings.length, due.map((d) => d.ms)]).toEqual([4, 2, [Connections.warnEveryMs - 1_000, Connections.warnEveryMs - 5_000]])
    now = 2 * Connections.warnEveryMs
    due[1]!.run()
    expect(warnings.at(-1)).toBe(Connections.refusedWarning(1, 1))
    // One held back, then another handled once the minute is up but before its line was due (a
    // reconnect storm): both said in one line now, and the line still due is cancelled, not said again.
    now = 2 * Connections.warnEveryMs + 5_000
    await connection(url).closed
    now = 3 * Connections.warnEveryMs
    await connection(url).closed
    expect([warnings.length, warnings.at(-1), cancelled]).toEqual([4, Connections.refusedWarning(1, 2), [2]])
    // Held back as the server closes: said then, not dropped with its timer.
    now = 3 * Connections.warnEveryMs + 1_000
    await connection(url).closed
    const closed = new Promise<void>((resolve) => listening.close(() => resolve()))
    for (const s of sockets.splice(0)) s.destroy()
    await closed
    await vi.waitFor(() => expect([warnings.length, warnings.at(-1), cancelled]).toEqual([5, Connections.refusedWarning(1, 1), [2, 3]]), { timeout: 30_000, interval: 10 })
    server = undefined
  })
})
