// Configuration: every bad value is named with its variable and rule; the limits come from core.
import { Config, Coordinator, parkRule, startCoordinator } from "@engram/coordinator"
import { Limits, Names, ParkPolicy } from "@engram/core"
import { Env } from "@engram/process"
import { freshDatabase } from "@engram/test-pg"
import { Effect, Exit, Layer, Logger, Redacted } from "effect"
import { existsSync, mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "vitest"

const WINDOW_RULE = "must be an integer from 1 to 31536000000 (a year: windows of days are in use, and every agent must take its coordinator's)"
const CPU_RULE = "must be a number from 0.001 to 100 (a hundred vCPUs offered per core: far past any workload's share)"
const MEM_RULE = "must be a number from 0 to 100 (a hundred times a host's RAM: far past what page sharing and ballooning give back)"
const RESERVE_RULE = "must be an integer from 0 to 16777216 (16 TiB: more RAM than one host holds)"
const REAPER_RULE = "must be an integer from 1 to 3600000 (an hour: stale reservations, parks and starving sessions wait a pass)"

describe("configuration", () => {
  it("defaults: port 7070 on 127.0.0.1, ./.engram, PGlite, SPEC §9 limits", () => {
    expect(Config.defaults()).toMatchObject({ port: 7070, host: "127.0.0.1", dataDir: "./.engram", databaseUrl: null, adminToken: null, metricsToken: null, limits: Limits.defaults })
  })

  it("environment values are parsed and checked by Limits.make", () => {
    const r = Config.parse({ ENGRAM_PORT: "0", ENGRAM_CPU_OVERCOMMIT: "2.5", ENGRAM_REQUIRE_MEASURED: "true", ENGRAM_REAPER_INTERVAL_MS: "500" })
    expect(r._tag).toBe("Valid")
    if (r._tag === "Valid") expect(r.config).toMatchObject({ port: 0, limits: { cpuOvercommit: 2.5, requireMeasured: true, reaperIntervalMs: 500 } })
  })

  it("the timing and count limits have core's upper bounds (a slip of digits is refused, never taken), named by variable and rule, or by key from a program; the bounds are taken", () => {
    const over = Config.parse({
      ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "999999999999999",
      ENGRAM_PARK_HARD_TTL_MS: "999999999999999",
      ENGRAM_COMMIT_ALLOWANCE_MS: "60001",
      ENGRAM_REAPER_INTERVAL_MS: "999999999999999",
      ENGRAM_MAX_ENTRIES_PER_NODE: "100001",
    })
    expect(over._tag === "Invalid" && over.issues.map((i) => [i.variable, i.rule, i.value])).toEqual([
      ["ENGRAM_MAX_ENTRIES_PER_NODE", "must be an integer from 1 to 100000 (far more VMs than one host runs)", "100001"],
      ["ENGRAM_HEARTBEAT_STALE_WINDOW_MS", WINDOW_RULE, "999999999999999"],
      ["ENGRAM_PARK_HARD_TTL_MS", "must be an integer from 1 to 31536000000 (a year)", "999999999999999"],
      ["ENGRAM_COMMIT_ALLOWANCE_MS", "must be a number from 0 to 60000 (a minute: every downtime estimate counts it, so one above a session's budget refuses its every move)", "60001"],
      ["ENGRAM_REAPER_INTERVAL_MS", REAPER_RULE, "999999999999999"],
    ])
    const edge = Config.parse({
      ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "31536000000",
      ENGRAM_RECLAIM_GRACE_MS: "31536000000",
      ENGRAM_PARK_HARD_TTL_MS: "31536000000",
      ENGRAM_COMMIT_ALLOWANCE_MS: "60000",
      ENGRAM_REAPER_INTERVAL_MS: "3600000",
      ENGRAM_MAX_ENTRIES_PER_NODE: "100000",
    })
    expect(edge._tag === "Valid" && edge.config.limits).toMatchObject({ heartbeatStaleWindowMs: 31_536_000_000, parkHardTtlMs: 31_536_000_000, commitAllowanceMs: 60_000, reaperIntervalMs: 3_600_000, maxEntriesPerNode: 100_000 })
    // A program's limits, as numbers: 10^15 ms of reaper interval named by key.
    const program = Config.parseInput({ limits: { ...Limits.defaults, reaperIntervalMs: 1e15 } })
    expect(program._tag === "Invalid" && program.issues.map((i) => [i.variable, i.rule, i.value])).toEqual([["limits.reaperIntervalMs", REAPER_RULE, 1e15]])
  })

  it("the system reserve and the overcommit ratios have core's upper bounds (and cpuOvercommit its least, 0.001: 5e-324 was taken), named by variable and rule, or by key from a program; nothing is taken; the bounds are", () => {
    const over = Config.parse({ ENGRAM_SYSTEM_RESERVE_MIB: "999999999999999", ENGRAM_CPU_OVERCOMMIT: "100.5", ENGRAM_MEM_OVERCOMMIT_RATIO: "1000" })
    expect(over._tag === "Invalid" && over.issues.map((i) => [i.variable, i.rule, i.value])).toEqual([
      ["ENGRAM_CPU_OVERCOMMIT", CPU_RULE, "100.5"],
      ["ENGRAM_MEM_OVERCOMMIT_RATIO", MEM_RULE, "1000"],
      ["ENGRAM_SYSTEM_RESERVE_MIB", RESERVE_RULE, "999999999999999"],
    ])
    const tiny = Config.parse({ ENGRAM_CPU_OVERCOMMIT: "0.0000001" })
    expect(tiny._tag === "Invalid" && tiny.issues.map((i) => [i.variable, i.rule])).toEqual([["ENGRAM_CPU_OVERCOMMIT", CPU_RULE]])
    const edge = Config.parse({ ENGRAM_SYSTEM_RESERVE_MIB: "16777216", ENGRAM_CPU_OVERCOMMIT: "100", ENGRAM_MEM_OVERCOMMIT_RATIO: "100" })
    expect(edge._tag === "Valid" && edge.config.limits).toMatchObject({ systemReserveMib: 16_777_216, cpuOvercommit: 100, memOvercommitRatio: 100 })
    const least = Config.parse({ ENGRAM_SYSTEM_RESERVE_MIB: "0", ENGRAM_CPU_OVERCOMMIT: "0.001", ENGRAM_MEM_OVERCOMMIT_RATIO: "0" })
    expect(least._tag === "Valid" && least.config.limits).toMatchObject({ systemReserveMib: 0, cpuOvercommit: 0.001, memOvercommitRatio: 0 })
    // A program's limits (startCoordinator({ config })), as numbers, named by key.
    const program = Config.parseInput({ limits: { ...Limits.defaults, systemReserveMib: 1e15, cpuOvercommit: Number.MIN_VALUE, memOvercommitRatio: 1e15 } })
    expect(program._tag === "Invalid" && program.issues.map((i) => [i.variable, i.rule, i.value])).toEqual([
      ["limits.cpuOvercommit", CPU_RULE, Number.MIN_VALUE],
      ["limits.memOvercommitRatio", MEM_RULE, 1e15],
      ["limits.systemReserveMib", RESERVE_RULE, 1e15],
    ])
  })

  it("an integer is decimal digits (at most 15: every one is exact): a blank, hex, an exponent, a fraction or more digits is refused naming the variable and its rule", () => {
    for (const v of [" ", "0x1F90", "1e3", "70.5", "7070 ", "99999999999999999999"]) {
      const r = Config.parse({ ENGRAM_PORT: v })
      expect(r._tag === "Invalid" && r.issues.map((i) => [i.variable, i.rule]), JSON.stringify(v)).toEqual([["ENGRAM_PORT", "must be an integer from 0 to 65535"]])
    }
    const big = Config.parse({ ENGRAM_SHUTDOWN_DELAY_MS: "1e300" })
    expect(big._tag === "Invalid" && big.issues.map((i) => i.variable)).toEqual(["ENGRAM_SHUTDOWN_DELAY_MS"])
    // The limits too (read as text, judged by core's Limits.make): decimal notation only.
    for (const v of ["0x3a98", "1.2e5", " 15000 "]) {
      const limit = Config.parse({ ENGRAM_HEARTBEAT_STALE_WINDOW_MS: v })
      expect(limit._tag === "Invalid" && limit.issues.map((i) => i.variable), JSON.stringify(v)).toEqual(["ENGRAM_HEARTBEAT_STALE_WINDOW_MS"])
    }
    const fraction = Config.parse({ ENGRAM_CPU_OVERCOMMIT: "2.5" })
    expect(fraction._tag === "Valid" && fraction.config.limits.cpuOvercommit).toBe(2.5)
    const ok = Config.parse({ ENGRAM_PORT: "+8080" })
    expect(ok._tag === "Valid" && ok.config.port).toBe(8080)
  })

  // A setting's default, a value that changes it, and one refused (naming the variable).
  it.each([
    // Placements on PostgreSQL may reuse a fleet read up to 100 ms old; 0 asks for a fresh read.
    { variable: "ENGRAM_PLACEMENT_READ_MAX_AGE_MS", key: "placementReadMaxAgeMs", byDefault: 100, set: "0", becomes: 0, refused: "-1" },
    // Replicas spread their placements; 0 turns it off; only 0 or 1.
    { variable: "ENGRAM_PLACEMENT_SPREAD", key: "placementSpread", byDefault: 1, set: "0", becomes: 0, refused: "2" },
    // PGlite runs in a worker thread; 0 keeps it in the main thread; only 0 or 1.
    { variable: "ENGRAM_PGLITE_WORKER", key: "pgliteWorker", byDefault: 1, set: "0", becomes: 0, refused: "yes" },
  ] as const)("$variable: $byDefault by default, $set sets $becomes, $refused is refused", ({ variable, key, byDefault, set, becomes, refused }) => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && d.config[key]).toBe(byDefault)
    const changed = Config.parse({ [variable]: set })
    expect(changed._tag === "Valid" && changed.config[key]).toBe(becomes)
    const bad = Config.parse({ [variable]: refused })
    expect(bad._tag === "Invalid" && bad.issues.map((i) => i.variable)).toEqual([variable])
  })

  it("traces go to the collector ENGRAM_OTLP_URL names (none by default); a bad URL or headers are refused by name, the headers never echoed", () => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && [d.config.otlpUrl, d.config.otlpHeaders]).toEqual([null, null])
    const set = Config.parse({ ENGRAM_OTLP_URL: "http://collector:4318", ENGRAM_OTLP_HEADERS: "x-api-key=secret-value-123" })
    expect(set._tag === "Valid" && set.config.otlpUrl).toBe("http://collector:4318")
    expect(set._tag === "Valid" && set.config.otlpHeaders !== null && Redacted.value(set.config.otlpHeaders)).toBe("x-api-key=secret-value-123")
    const bad = Config.parse({ ENGRAM_OTLP_URL: "collector:4318", ENGRAM_OTLP_HEADERS: "no-equals-sign-secret" })
    expect(bad._tag === "Invalid" && bad.issues.map((i) => i.variable).sort()).toEqual(["ENGRAM_OTLP_HEADERS", "ENGRAM_OTLP_URL"])
    expect(JSON.stringify(bad)).not.toContain("no-equals-sign-secret")
  })

  it("an OTLP URL with user:password@ is refused naming ENGRAM_OTLP_URL, the secret never echoed (credentials go in ENGRAM_OTLP_HEADERS)", async () => {
    const rule = "must be an http:// or https:// URL without user:password@ (the URL is logged; give the collector's credentials in ENGRAM_OTLP_HEADERS, a secret)"
    for (const url of ["http://user:hunter2-secret@collector:4318", "https://hunter2-secret@collector:4318/", "http://user:hunter2/secret@collector:4318"]) {
      const r = Config.parse({ ENGRAM_OTLP_URL: url })
      expect(r._tag === "Invalid" && r.issues.map((i) => [i.variable, i.rule, i.value]), url).toEqual([["ENGRAM_OTLP_URL", rule, Env.hidden]])
      const p = Config.parseInput({ otlpUrl: url })
      expect(p._tag === "Invalid" && p.issues.map((i) => [i.variable, i.rule]), url).toEqual([["otlpUrl", rule]])
      expect(JSON.stringify([r, p])).not.toContain("hunter2")
      const exit = await Effect.runPromiseExit(Config.fromEnvironment({ ENGRAM_OTLP_URL: url }))
      expect(String(Exit.isFailure(exit) ? exit.cause : "")).toContain("ENGRAM_OTLP_URL")
      expect(String(Exit.isFailure(exit) ? exit.cause : "")).not.toContain("hunter2")
    }
    // An @ in the path is no user information.
    const path = Config.parse({ ENGRAM_OTLP_URL: "https://collector.example/team@x" })
    expect(path._tag === "Valid" && path.config.otlpUrl).toBe("https://collector.example/team@x")
  })

  it("ENGRAM_HOST is a host name or IP address (an IPv6 one without brackets), by core's host rule (the agents' listen hosts'); anything else is refused naming it", () => {
    for (const host of ["127.0.0.1", "0.0.0.0", "::", "::1", "fd00::5", "localhost", "c1.example.com", "my-host"]) {
      const r = Config.parse({ ENGRAM_HOST: host })
      expect(r._tag === "Valid" && r.config.host, host).toBe(host)
    }
    for (const host of ["http://10.0.0.5", "10.0.0.5:7070", "[::1]", "my host", " 127.0.0.1", "127.0.0.1\n", "a/b", "u@h", "h?x"]) {
      const r = Config.parse({ ENGRAM_HOST: host })
      expect(r._tag === "Invalid" && r.issues.map((i) => [i.variable, i.rule]), JSON.stringify(host)).toEqual([["ENGRAM_HOST", Names.hostRule]])
      const p = Config.parseInput({ host })
      expect(p._tag === "Invalid" && p.issues.map((i) => i.variable), JSON.stringify(host)).toEqual(["host"])
    }
  })

  it("an empty value is unset, its default, for every variable (ENGRAM_DATA_DIR and ENGRAM_HOST too); a blank data dir or one with whitespace around it is refused naming it", async () => {
    const empty = Object.fromEntries(Config.variables.filter((v) => v !== "ENGRAM_CONFIG_FILE").map((v) => [v, ""]))
    const d = await Effect.runPromise(Config.fromEnvironment(empty))
    expect(d).toEqual(await Effect.runPromise(Config.fromEnvironment({})))
    expect([d.host, d.dataDir, d.limits.requireMeasured]).toEqual(["127.0.0.1", "./.engram", false])
    for (const dir of [" ", "\t", " ./.engram", "/var/lib/engram\n"]) {
      const r = Config.parse({ ENGRAM_DATA_DIR: dir })
      expect(r._tag === "Invalid" && r.issues.map((i) => [i.variable, i.rule]), JSON.stringify(dir)).toEqual([["ENGRAM_DATA_DIR", Config.dataDirRule]])
      const p = Config.parseInput({ dataDir: dir })
      expect(p._tag === "Invalid" && p.issues.map((i) => i.variable), JSON.stringify(dir)).toEqual(["dataDir"])
    }
    const kept = Config.parse({ ENGRAM_DATA_DIR: "/var/lib/engram data" })
    expect(kept._tag === "Valid" && kept.config.dataDir).toBe("/var/lib/engram data")
  })

  it("ENGRAM_REQUIRE_MEASURED is true, false, 1 or 0 as written, as every on/off setting is read exactly: blanks or another case are refused naming it", async () => {
    for (const [text, value] of [["true", true], ["1", true], ["false", false], ["0", false]] as const) {
      const r = Config.parse({ ENGRAM_REQUIRE_MEASURED: text })
      expect(r._tag === "Valid" && r.config.limits.requireMeasured, text).toBe(value)
    }
    for (const text of [" TRUE ", "TRUE", "True", " true", "false ", " 1", "yes"]) {
      const r = Config.parse({ ENGRAM_REQUIRE_MEASURED: text })
      expect(r._tag === "Invalid" && r.issues.map((i) => [i.variable, i.rule]), JSON.stringify(text)).toEqual([["ENGRAM_REQUIRE_MEASURED", Config.booleanRule]])
    }
    // The same rule as the other on/off settings: " 1" is refused there too.
    expect(Config.parse({ ENGRAM_MAKE_ROOM_MOVES: " 1" })._tag).toBe("Invalid")
    // A program's boolean and a file's JSON boolean are read as before.
    const p = Config.parseInput({ limits: { ...Limits.defaults, requireMeasured: true } })
    expect(p._tag === "Valid" && p.config.limits.requireMeasured).toBe(true)
    const file = join(mkdtempSync(join(tmpdir(), "engram-cfg-")), "c.json")
    writeFileSync(file, JSON.stringify({ ENGRAM_REQUIRE_MEASURED: true }))
    const fromFile = await Effect.runPromise(Config.fromEnvironment({ ENGRAM_CONFIG_FILE: file }))
    expect(fromFile.limits.requireMeasured).toBe(true)
  })

  it("every store call is bounded by 15 s by default (ENGRAM_STORE_TIMEOUT_MS), from 100 ms to 10 min", () => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && d.config.storeTimeoutMs).toBe(15_000)
    const set = Config.parse({ ENGRAM_STORE_TIMEOUT_MS: "1500" })
    expect(set._tag === "Valid" && set.config.storeTimeoutMs).toBe(1500)
    const bad = Config.parse({ ENGRAM_STORE_TIMEOUT_MS: "0" })
    expect(bad._tag === "Invalid" && bad.issues.map((i) => [i.variable, i.rule])).toEqual([["ENGRAM_STORE_TIMEOUT_MS", "must be an integer from 100 to 600000"]])
  })

  it("a replica's store pool holds 10 connections by default (ENGRAM_STORE_POOL_SIZE), from 1 to 1000; the replica needs 2 more (lease, listener)", () => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && d.config.storePoolSize).toBe(10)
    expect(Config.connectionsPerReplica(10)).toBe(12)
    const set = Config.parse({ ENGRAM_STORE_POOL_SIZE: "3" })
    expect(set._tag === "Valid" && set.config.storePoolSize).toBe(3)
    for (const value of ["0", "1001", "2.5", "ten", "-1"]) {
      const bad = Config.parse({ ENGRAM_STORE_POOL_SIZE: value })
      expect(bad._tag === "Invalid" && bad.issues.map((i) => [i.variable, i.rule])).toEqual([["ENGRAM_STORE_POOL_SIZE", "must be an integer from 1 to 1000"]])
    }
    // PostgreSQL only: the embedded store's start warns of it (ENGRAM_DATABASE_URL unset).
    expect(set._tag === "Valid" && Config.postgresOnlySet(set.config)).toEqual(["ENGRAM_STORE_POOL_SIZE"])
  })

  it("the probes' store reads are bounded by 1 s by default (ENGRAM_PROBE_TIMEOUT_MS), from 10 ms to 1 min", () => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && d.config.probeTimeoutMs).toBe(1000)
    const bad = Config.parse({ ENGRAM_PROBE_TIMEOUT_MS: "5" })
    expect(bad._tag === "Invalid" && bad.issues.map((i) => [i.variable, i.rule])).toEqual([["ENGRAM_PROBE_TIMEOUT_MS", "must be an integer from 10 to 60000"]])
  })

  it("group placement takes batches of 64 gathered for 200 µs by default; a size below 1 or a fractional window is refused", () => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && [d.config.placementBatchSize, d.config.placementBatchWindowUs]).toEqual([64, 200])
    const batch = Config.parse({ ENGRAM_PLACEMENT_BATCH_SIZE: "1", ENGRAM_PLACEMENT_BATCH_WINDOW_US: "0" })
    expect(batch._tag === "Valid" && [batch.config.placementBatchSize, batch.config.placementBatchWindowUs]).toEqual([1, 0])
    const badBatch = Config.parse({ ENGRAM_PLACEMENT_BATCH_SIZE: "0", ENGRAM_PLACEMENT_BATCH_WINDOW_US: "0.5" })
    expect(badBatch._tag === "Invalid" && badBatch.issues.map((i) => i.variable).sort()).toEqual(["ENGRAM_PLACEMENT_BATCH_SIZE", "ENGRAM_PLACEMENT_BATCH_WINDOW_US"])
  })

  it("placement forwarding is off by default; its bound and the peer URL are checked, each bad one named", () => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && [d.config.placementForward, d.config.placementForwardTimeoutMs, d.config.peerUrl, d.config.placementWindowByReplicas]).toEqual([0, 1000, null, 0])
    const on = Config.parse({ ENGRAM_PLACEMENT_FORWARD: "1", ENGRAM_PLACEMENT_FORWARD_TIMEOUT_MS: "250", ENGRAM_PEER_URL: "http://10.0.0.5:7070/" })
    expect(on._tag === "Valid" && [on.config.placementForward, on.config.placementForwardTimeoutMs, on.config.peerUrl]).toEqual([1, 250, "http://10.0.0.5:7070"])
    const bad = Config.parse({ ENGRAM_PLACEMENT_FORWARD: "yes", ENGRAM_PLACEMENT_FORWARD_TIMEOUT_MS: "5", ENGRAM_PEER_URL: "http://10.0.0.5:7070/v1", ENGRAM_PLACEMENT_WINDOW_BY_REPLICAS: "2" })
    expect(bad._tag === "Invalid" && bad.issues.map((i) => i.variable).sort()).toEqual([
      "ENGRAM_PEER_URL",
      "ENGRAM_PLACEMENT_FORWARD",
      "ENGRAM_PLACEMENT_FORWARD_TIMEOUT_MS",
      "ENGRAM_PLACEMENT_WINDOW_BY_REPLICAS",
    ])
  })

  it("ENGRAM_PEER_URL follows the agents' peer URL rule (core's Move.isPeerUrl): a wildcard host or user:password@ is refused naming the variable and the rule, from the environment and a program", () => {
    const rule =
      "must be an absolute http:// or https:// URL of at most 2048 characters naming a host peers reach (not 0.0.0.0 or ::), without spaces, control characters, user:password@, a query or a fragment, and without a path: where the other replicas reach this one (http://10.0.0.5:7070)"
    for (const url of ["http://0.0.0.0:7070", "http://[::]:7070/", "http://0:7070", "http://u:p@x:7070", "http://u@x:7070", "http://10.0.0.5:7070/v1", "ftp://10.0.0.5:7070", "http://10.0.0.5:7070?x=1"]) {
      const r = Config.parse({ ENGRAM_PEER_URL: url })
      // A value that may hold user:password@ is never echoed, nor a query (the agents' rule).
      expect(r._tag === "Invalid" && r.issues.map((i) => [i.variable, i.rule, i.value]), url).toEqual([["ENGRAM_PEER_URL", rule, url.includes("@") ? Env.hidden : url.replace("?x=1", "?***")]])
      const p = Config.parseInput({ peerUrl: url })
      expect(p._tag === "Invalid" && p.issues.map((i) => [i.variable, i.rule]), url).toEqual([["peerUrl", rule]])
    }
    for (const [url, kept] of [
      ["http://10.0.0.5:7070/", "http://10.0.0.5:7070"],
      ["https://c1.example:7070", "https://c1.example:7070"],
      ["http://[fd00::5]:7070", "http://[fd00::5]:7070"],
    ] as const) {
      const r = Config.parse({ ENGRAM_PEER_URL: url })
      expect(r._tag === "Valid" && r.config.peerUrl, url).toBe(kept)
    }
  })

  it("a refused ENGRAM_PEER_URL or ENGRAM_OTLP_URL never echoes its query or fragment (a token may ride there): masked as the agents' peer URLs are", async () => {
    for (const [url, shown] of [
      ["http://10.0.0.5:7070/?token=hunter2", "http://10.0.0.5:7070/?***"],
      ["http://10.0.0.5:7070?token=hunter2", "http://10.0.0.5:7070?***"],
      ["http://10.0.0.5:7070/#hunter2", "http://10.0.0.5:7070/#***"],
    ] as const) {
      const exit = await Effect.runPromiseExit(Config.fromEnvironment({ ENGRAM_PEER_URL: url }))
      const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: Env.ConfigInvalid }).error : undefined
      expect(error?.issues.map((i) => [i.variable, i.value]), url).toEqual([["ENGRAM_PEER_URL", shown]])
      expect(error?.message, url).not.toContain("hunter2")
    }
    const otlp = Config.parse({ ENGRAM_OTLP_URL: "ftp://collector:4318/?api_key=hunter2" })
    expect(otlp._tag === "Invalid" && otlp.issues.map((i) => [i.variable, i.value])).toEqual([["ENGRAM_OTLP_URL", "ftp://collector:4318/?***"]])
  })

  it("the reserve's groups, lead per class and slow classes' 99 % are on by default (core's defaults); 0 turns each off for the reaper; a bad value is named with its rule", () => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && [d.config.reserveGroups, d.config.reserveLeadPerClass, d.config.reserveSlowClass]).toEqual([1, 1, 1])
    expect(d._tag === "Valid" && parkRule(d.config)).toEqual(ParkPolicy.defaultRule)
    const off = Config.parse({ ENGRAM_RESERVE_GROUPS: "0", ENGRAM_RESERVE_LEAD_PER_CLASS: "0", ENGRAM_RESERVE_SLOW_CLASS: "0" })
    expect(off._tag === "Valid" && parkRule(off.config)).toEqual({
      name: ParkPolicy.defaultName,
      options: { ...ParkPolicy.defaultOptions, reserveGroups: false, reserveLeadPerClass: false, reserveSlowClassQuantile: ParkPolicy.defaultOptions.reserveQuantile },
    })
    const one = Config.parse({ ENGRAM_RESERVE_GROUPS: "0" })
    expect(one._tag === "Valid" && parkRule(one.config).options).toMatchObject({ reserveGroups: false, reserveLeadPerClass: true })
    const bad = Config.parse({ ENGRAM_RESERVE_GROUPS: "yes", ENGRAM_RESERVE_LEAD_PER_CLASS: "2", ENGRAM_RESERVE_SLOW_CLASS: "0.5" })
    expect(bad._tag === "Invalid" && bad.issues.map((i) => [i.variable, i.rule]).sort()).toEqual([
      ["ENGRAM_RESERVE_GROUPS", "must be an integer from 0 to 1"],
      ["ENGRAM_RESERVE_LEAD_PER_CLASS", "must be an integer from 0 to 1"],
      ["ENGRAM_RESERVE_SLOW_CLASS", "must be an integer from 0 to 1"],
    ])
  })

  it("the slow classes' quantile is core's 0.99 by default; a value above 0.9 and below 1 goes to the reaper's rule (not with the slow classes off); any other is refused naming the variable and the rule", () => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && d.config.reserveSlowClassQuantile).toBe(ParkPolicy.defaultOptions.reserveSlowClassQuantile)
    const set = Config.parse({ ENGRAM_RESERVE_SLOW_CLASS_QUANTILE: "0.995" })
    expect(set._tag === "Valid" && parkRule(set.config)).toEqual({ name: ParkPolicy.defaultName, options: { ...ParkPolicy.defaultOptions, reserveSlowClassQuantile: 0.995 } })
    expect(Config.parse({ ENGRAM_RESERVE_SLOW_CLASS_QUANTILE: ".95" })).toMatchObject({ _tag: "Valid", config: { reserveSlowClassQuantile: 0.95 } })
    // Off, a slow class keeps the base quantile's places whatever its own quantile.
    const off = Config.parse({ ENGRAM_RESERVE_SLOW_CLASS: "0", ENGRAM_RESERVE_SLOW_CLASS_QUANTILE: "0.995" })
    expect(off._tag === "Valid" && parkRule(off.config).options.reserveSlowClassQuantile).toBe(ParkPolicy.defaultOptions.reserveQuantile)
    // A program's setting is judged alike, named by its key.
    expect(Config.parseInput({ reserveSlowClassQuantile: 0.999 })).toMatchObject({ _tag: "Valid", config: { reserveSlowClassQuantile: 0.999 } })
    // A computed number, 16 digits after the point in its shortest form (0.9949499999999999), is taken as it is.
    expect(Config.parseInput({ reserveSlowClassQuantile: 0.99 * 1.005 })).toMatchObject({ _tag: "Valid", config: { reserveSlowClassQuantile: 0.99 * 1.005 } })
    expect(Config.parseInput({ reserveSlowClassQuantile: 1 - 1e-16 })).toMatchObject({ _tag: "Valid", config: { reserveSlowClassQuantile: 1 - 1e-16 } })
    const rule = "must be a decimal number above 0.9 (every class's reserveQuantile: at or below it a slow class gains no place) and below 1"
    const byProgram = Config.parseInput({ reserveSlowClassQuantile: 1 })
    expect(byProgram._tag === "Invalid" && byProgram.issues.map((i) => [i.variable, i.rule])).toEqual([["reserveSlowClassQuantile", rule]])
    for (const value of ["0.9", "0.5", "1", "1.0", "0", "-0.95", "+0.95", "9.9e-1", "0x1", "0.99 ", "ninety-nine", "99"]) {
      const bad = Config.parse({ ENGRAM_RESERVE_SLOW_CLASS_QUANTILE: value })
      expect(bad._tag === "Invalid" && bad.issues.map((i) => [i.variable, i.rule, i.value]), value).toEqual([["ENGRAM_RESERVE_SLOW_CLASS_QUANTILE", rule, value]])
    }
  })

  it("make-room moves are on by default, 16 a pass, a 10-minute cooldown; each bad value is named with its rule", () => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && [d.config.makeRoomMoves, d.config.makeRoomMovesPerPass, d.config.makeRoomCooldownMs]).toEqual([1, 16, 600_000])
    const on = Config.parse({ ENGRAM_MAKE_ROOM_MOVES: "1", ENGRAM_MAKE_ROOM_MOVES_PER_PASS: "4", ENGRAM_MAKE_ROOM_COOLDOWN_MS: "0" })
    expect(on._tag === "Valid" && [on.config.makeRoomMoves, on.config.makeRoomMovesPerPass, on.config.makeRoomCooldownMs]).toEqual([1, 4, 0])
    const bad = Config.parse({ ENGRAM_MAKE_ROOM_MOVES: "yes", ENGRAM_MAKE_ROOM_MOVES_PER_PASS: "0", ENGRAM_MAKE_ROOM_COOLDOWN_MS: "-1" })
    expect(bad._tag === "Invalid" && bad.issues.map((i) => [i.variable, i.rule]).sort()).toEqual([
      ["ENGRAM_MAKE_ROOM_COOLDOWN_MS", "must be an integer from 0 to 604800000"],
      ["ENGRAM_MAKE_ROOM_MOVES", "must be an integer from 0 to 1"],
      ["ENGRAM_MAKE_ROOM_MOVES_PER_PASS", "must be an integer from 1 to 1000"],
    ])
  })

  it("the reaper's leader steps down after 3 failed passes in a row by default; 0 never; a bad value is named with its rule", () => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && d.config.leaderStepDownPasses).toBe(3)
    const off = Config.parse({ ENGRAM_LEADER_STEP_DOWN_PASSES: "0" })
    expect(off._tag === "Valid" && off.config.leaderStepDownPasses).toBe(0)
    for (const v of ["-1", "1001", "2.5", "many"]) {
      const bad = Config.parse({ ENGRAM_LEADER_STEP_DOWN_PASSES: v })
      expect(bad._tag === "Invalid" && bad.issues.map((i) => [i.variable, i.rule])).toEqual([["ENGRAM_LEADER_STEP_DOWN_PASSES", "must be an integer from 0 to 1000"]])
    }
  })

  it("history is kept 7 days by default and pruned 1,000 rows of each kind a pass; 0 keeps it for ever; a bad value or one shorter than the windows that read history is named with its rule", () => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && [d.config.retentionMs, d.config.retentionPruneLimit]).toEqual([7 * 24 * 3_600_000, 1000])
    const off = Config.parse({ ENGRAM_RETENTION_MS: "0", ENGRAM_RETENTION_PRUNE_LIMIT: "10000" })
    expect(off._tag === "Valid" && [off.config.retentionMs, off.config.retentionPruneLimit]).toEqual([0, 10_000])
    // Exactly the longer of the allowance horizon and the make-room cooldown is enough.
    const tight = Config.parse({ ENGRAM_RETENTION_MS: "3600000", ENGRAM_ALLOWANCE_HORIZON_MS: "3600000", ENGRAM_MAKE_ROOM_COOLDOWN_MS: "600000" })
    expect(tight._tag === "Valid" && tight.config.retentionMs).toBe(3_600_000)
    const bad = Config.parse({ ENGRAM_RETENTION_MS: "7d", ENGRAM_RETENTION_PRUNE_LIMIT: "0" })
    expect(bad._tag === "Invalid" && bad.issues.map((i) => [i.variable, i.rule]).sort()).toEqual([
      ["ENGRAM_RETENTION_MS", "must be an integer from 0 to 315360000000"],
      ["ENGRAM_RETENTION_PRUNE_LIMIT", "must be an integer from 1 to 10000"],
    ])
    for (const [raw, value] of [[{ ENGRAM_RETENTION_MS: "-1" }, "-1"], [{ ENGRAM_RETENTION_MS: "1.5" }, "1.5"], [{ ENGRAM_RETENTION_PRUNE_LIMIT: "10001" }, "10001"]] as const) {
      const r = Config.parse(raw)
      expect(r._tag === "Invalid" && r.issues.map((i) => i.value), JSON.stringify(raw)).toEqual([value])
    }
    const short = Config.parse({ ENGRAM_RETENTION_MS: "3599999" })
    expect(short._tag === "Invalid" && short.issues.map((i) => [i.variable, i.rule])).toEqual([
      ["ENGRAM_RETENTION_MS", "must be 0 (keep history for ever) or at least ENGRAM_ALLOWANCE_HORIZON_MS (3600000) and ENGRAM_MAKE_ROOM_COOLDOWN_MS (600000)"],
    ])
    const belowCooldown = Config.parse({ ENGRAM_RETENTION_MS: "3600000", ENGRAM_MAKE_ROOM_COOLDOWN_MS: "3600001" })
    expect(belowCooldown._tag === "Invalid" && belowCooldown.issues.map((i) => i.variable)).toEqual(["ENGRAM_RETENTION_MS"])
  })

  it("the failover grace defaults to the heartbeat stale window (and follows it); 0 disables it; a bad value is named with its rule", () => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && d.config.reclaimGraceMs).toBe(120_000)
    const follows = Config.parse({ ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "30000" })
    expect(follows._tag === "Valid" && follows.config.reclaimGraceMs).toBe(30_000)
    const off = Config.parse({ ENGRAM_RECLAIM_GRACE_MS: "0" })
    expect(off._tag === "Valid" && off.config.reclaimGraceMs).toBe(0)
    const set = Config.parse({ ENGRAM_RECLAIM_GRACE_MS: "300000" })
    expect(set._tag === "Valid" && set.config.reclaimGraceMs).toBe(300_000)
    for (const value of ["-1", "1.5", "2m"]) {
      const r = Config.parse({ ENGRAM_RECLAIM_GRACE_MS: value })
      expect(r._tag === "Invalid" && r.issues.map((i) => [i.variable, i.rule, i.value]), value).toEqual([["ENGRAM_RECLAIM_GRACE_MS", "must be an integer >= 0", value]])
    }
    // Shorter than the agents' heartbeat interval (a third of the stale window) it protects nothing: refused, named with its rule.
    const rule = (min: number) =>
      `must be 0 (no grace) or at least a third of ENGRAM_HEARTBEAT_STALE_WINDOW_MS (${min}, the agents' heartbeat interval): a shorter grace ends before a live host's next heartbeat`
    const short = Config.parse({ ENGRAM_RECLAIM_GRACE_MS: "39999" })
    expect(short._tag === "Invalid" && short.issues.map((i) => [i.variable, i.rule, i.value])).toEqual([["ENGRAM_RECLAIM_GRACE_MS", rule(40_000), "39999"]])
    const third = Config.parse({ ENGRAM_RECLAIM_GRACE_MS: "40000" })
    expect(third._tag === "Valid" && third.config.reclaimGraceMs).toBe(40_000)
    // The rule follows the stale window set beside it; a longer window makes a grace that was enough too short.
    const longWindow = Config.parse({ ENGRAM_RECLAIM_GRACE_MS: "40000", ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "300000" })
    expect(longWindow._tag === "Invalid" && longWindow.issues.map((i) => [i.variable, i.rule])).toEqual([["ENGRAM_RECLAIM_GRACE_MS", rule(100_000)]])
    expect(Config.parse({ ENGRAM_RECLAIM_GRACE_MS: "1000", ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "3000" })._tag).toBe("Valid")
  })

  it("a stale window over a day lets the grace follow it: at most the longer of a day and the window, never a range with nothing in it", () => {
    const day = 24 * 3_600_000
    const rule = (max: number) => `must be at most the longer of a day (86400000) and ENGRAM_HEARTBEAT_STALE_WINDOW_MS (${max})`
    // A 4-day window: its third (32 h) and the window itself are valid explicit graces, as the default (the window) is.
    for (const grace of [4 * day, Math.floor((4 * day) / 3), 0]) {
      const r = Config.parse({ ENGRAM_HEARTBEAT_STALE_WINDOW_MS: String(4 * day), ENGRAM_RECLAIM_GRACE_MS: String(grace) })
      expect(r._tag === "Valid" && r.config.reclaimGraceMs, String(grace)).toBe(grace)
    }
    const byDefault = Config.parse({ ENGRAM_HEARTBEAT_STALE_WINDOW_MS: String(4 * day) })
    expect(byDefault._tag === "Valid" && byDefault.config.reclaimGraceMs).toBe(4 * day)
    const over = Config.parse({ ENGRAM_HEARTBEAT_STALE_WINDOW_MS: String(4 * day), ENGRAM_RECLAIM_GRACE_MS: String(4 * day + 1) })
    expect(over._tag === "Invalid" && over.issues.map((i) => [i.variable, i.rule, i.value])).toEqual([["ENGRAM_RECLAIM_GRACE_MS", rule(4 * day), String(4 * day + 1)]])
    // A window of a day or less: a day is the longest grace, as before.
    expect(Config.parse({ ENGRAM_RECLAIM_GRACE_MS: String(day) })._tag).toBe("Valid")
    const long = Config.parse({ ENGRAM_RECLAIM_GRACE_MS: String(day + 1) })
    expect(long._tag === "Invalid" && long.issues.map((i) => [i.variable, i.rule])).toEqual([["ENGRAM_RECLAIM_GRACE_MS", rule(120_000)]])
  })

  it("a file's values meet the same rules between settings, named by variable", async () => {
    const dir = mkdtempSync(join(tmpdir(), "engram-config-"))
    const file = join(dir, "c.json")
    writeFileSync(file, JSON.stringify({ ENGRAM_RECLAIM_GRACE_MS: 1, ENGRAM_HEARTBEAT_STALE_WINDOW_MS: 30_000 }))
    const exit = await Effect.runPromiseExit(Config.fromEnvironment({ ENGRAM_CONFIG_FILE: file, ENGRAM_RETENTION_MS: "1" }))
    const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: Env.ConfigInvalid }).error : undefined
    expect(error?.message).toBe(
      [
        "invalid coordinator configuration:",
        '  ENGRAM_RETENTION_MS="1": must be 0 (keep history for ever) or at least ENGRAM_ALLOWANCE_HORIZON_MS (3600000) and ENGRAM_MAKE_ROOM_COOLDOWN_MS (600000)',
        "  ENGRAM_RECLAIM_GRACE_MS=1: must be 0 (no grace) or at least a third of ENGRAM_HEARTBEAT_STALE_WINDOW_MS (10000, the agents' heartbeat interval): a shorter grace ends before a live host's next heartbeat",
      ].join("\n"),
    )
  })

  it("a rule between settings is reported beside another setting's own refusal, all at once", () => {
    const r = Config.parse({ ENGRAM_PORT: "seventy", ENGRAM_RETENTION_MS: "1", ENGRAM_RECLAIM_GRACE_MS: "1", ENGRAM_CPU_OVERCOMMIT: "0" })
    expect(r._tag === "Invalid" && r.issues.map((i) => i.variable)).toEqual(["ENGRAM_PORT", "ENGRAM_CPU_OVERCOMMIT", "ENGRAM_RETENTION_MS", "ENGRAM_RECLAIM_GRACE_MS"])
    // A rule whose own setting was refused is not judged on a guess.
    const own = Config.parse({ ENGRAM_RETENTION_MS: "7d", ENGRAM_LEASE_DURATION_MS: "1000", ENGRAM_LEASE_RENEW_DEADLINE_MS: "1000" })
    expect(own._tag === "Invalid" && own.issues.map((i) => i.variable)).toEqual(["ENGRAM_RETENTION_MS", "ENGRAM_LEASE_RENEW_DEADLINE_MS"])
    const input = Config.parseInput({ port: -1, retentionMs: 1 })
    expect(input._tag === "Invalid" && input.issues.map((i) => i.variable)).toEqual(["port", "retentionMs"])
  })

  it("the lease's renew deadline must be shorter than the lease, named with both figures", () => {
    const equal = Config.parse({ ENGRAM_LEASE_DURATION_MS: "1000", ENGRAM_LEASE_RENEW_DEADLINE_MS: "1000" })
    expect(equal._tag === "Invalid" && equal.issues).toEqual([{ variable: "ENGRAM_LEASE_RENEW_DEADLINE_MS", rule: "must be less than ENGRAM_LEASE_DURATION_MS (1000)", value: "1000" }])
    const edge = Config.parse({ ENGRAM_LEASE_DURATION_MS: "1000", ENGRAM_LEASE_RENEW_DEADLINE_MS: "999" })
    expect(edge._tag === "Valid" && [edge.config.leaseDurationMs, edge.config.leaseRenewDeadlineMs]).toEqual([1000, 999])
  })

  it("heartbeats and reports gather for 100 ms by default; 0 writes only what arrives together; beyond 10 s is refused", () => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && d.config.beatWindowMs).toBe(100)
    const none = Config.parse({ ENGRAM_BEAT_WINDOW_MS: "0" })
    expect(none._tag === "Valid" && none.config.beatWindowMs).toBe(0)
    const bad = Config.parse({ ENGRAM_BEAT_WINDOW_MS: "10001" })
    expect(bad._tag === "Invalid" && bad.issues.map((i) => [i.variable, i.rule])).toEqual([["ENGRAM_BEAT_WINDOW_MS", "must be an integer from 0 to 10000"]])
  })

  it("heartbeats gather for less than the stale window less the agents' heartbeat interval (a third of it), named with both figures", () => {
    const rule = (window: string, most: number) =>
      `must be less than ${window} less a third of it, the agents' heartbeat interval (${most}): a heartbeat held longer is written after its host may have gone stale`
    const over = Config.parse({ ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "3000", ENGRAM_BEAT_WINDOW_MS: "2000" })
    expect(over._tag === "Invalid" && over.issues).toEqual([{ variable: "ENGRAM_BEAT_WINDOW_MS", rule: rule("ENGRAM_HEARTBEAT_STALE_WINDOW_MS", 2000), value: "2000" }])
    // The default window (100 ms) beside a small stale window: refused too, the same words.
    const small = Config.parse({ ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "150" })
    expect(small._tag === "Invalid" && small.issues.map((i) => [i.variable, i.rule])).toEqual([["ENGRAM_BEAT_WINDOW_MS", rule("ENGRAM_HEARTBEAT_STALE_WINDOW_MS", 100)]])
    // The edge: 1 ms less.
    const edge = Config.parse({ ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "3000", ENGRAM_BEAT_WINDOW_MS: "1999" })
    expect(edge._tag === "Valid" && edge.config.beatWindowMs).toBe(1999)
    expect(Config.parse({ ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "1", ENGRAM_BEAT_WINDOW_MS: "0" })._tag).toBe("Valid")
  })

  it("a file's null for a setting that cannot be null is refused with the setting's own rule, not taken for its default", async () => {
    const r = Config.parse({ ENGRAM_PORT: null, ENGRAM_REAPER_INTERVAL_MS: null, ENGRAM_DATABASE_URL: null })
    expect(r._tag === "Invalid" && r.issues).toEqual([
      { variable: "ENGRAM_PORT", rule: "must be an integer from 0 to 65535", value: null },
      { variable: "ENGRAM_REAPER_INTERVAL_MS", rule: "must be an integer from 1 to 3600000 (an hour: stale reservations, parks and starving sessions wait a pass)", value: null },
    ])
    const file = join(mkdtempSync(join(tmpdir(), "engram-config-")), "c.json")
    writeFileSync(file, JSON.stringify({ ENGRAM_LEASE_DURATION_MS: 5000, ENGRAM_LEASE_RENEW_DEADLINE_MS: null }))
    const exit = await Effect.runPromiseExit(Config.fromEnvironment({ ENGRAM_CONFIG_FILE: file }))
    const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: Env.ConfigInvalid }).error : undefined
    // Only its own rule: the lease's rule is not judged on the default it would have had.
    expect(error?.message).toBe("invalid coordinator configuration:\n  ENGRAM_LEASE_RENEW_DEADLINE_MS=null: must be an integer from 50 to 3600000")
  })

  it("the commit allowance counts commits of the last hour by default; the horizon is checked, a bad one named", () => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && d.config.allowanceHorizonMs).toBe(3_600_000)
    const short = Config.parse({ ENGRAM_ALLOWANCE_HORIZON_MS: "600000" })
    expect(short._tag === "Valid" && short.config.allowanceHorizonMs).toBe(600_000)
    for (const v of ["0", "999", "1h", "604800001"]) {
      const bad = Config.parse({ ENGRAM_ALLOWANCE_HORIZON_MS: v })
      expect(bad._tag === "Invalid" && bad.issues.map((i) => [i.variable, i.rule])).toEqual([["ENGRAM_ALLOWANCE_HORIZON_MS", "must be an integer from 1000 to 604800000"]])
    }
  })

  it("a config file's unknown key names the ENGRAM_* variable it likely meant (a startCoordinator key, a misspelling); only numbers and booleans are shown", async () => {
    const file = join(mkdtempSync(join(tmpdir(), "engram-config-")), "c.json")
    writeFileSync(
      file,
      JSON.stringify({ port: 17199, prot: 1, adminToken: "short", ENGRAM_ADMIN_TOKN: "s3cret-s3cret-s3cret", maxEntriesPerNode: 8, zzz: "x", pgUrl: "postgres://engram:hunter2pw@db/engram", ENGRAM_PEER_KEY: "peer-sekret" }),
    )
    const exit = await Effect.runPromiseExit(Config.fromEnvironment({ ENGRAM_CONFIG_FILE: file }))
    const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: Env.ConfigInvalid }).error : undefined
    const hint = (h: string) => `is not a known setting (in ${file}; the file's keys are the ENGRAM_* variable names: did you mean ${h}?)`
    expect(error?.issues).toEqual([
      { variable: "port", rule: hint("ENGRAM_PORT"), value: 17199 },
      { variable: "prot", rule: hint("ENGRAM_PORT"), value: 1 },
      { variable: "adminToken", rule: hint("ENGRAM_ADMIN_TOKEN"), value: Env.hidden },
      { variable: "ENGRAM_ADMIN_TOKN", rule: hint("ENGRAM_ADMIN_TOKEN"), value: Env.hidden },
      { variable: "maxEntriesPerNode", rule: hint("ENGRAM_MAX_ENTRIES_PER_NODE"), value: 8 },
      { variable: "zzz", rule: `is not a known setting (in ${file}; the file's keys are the ENGRAM_* variable names)`, value: Env.hidden },
      { variable: "pgUrl", rule: hint("ENGRAM_PEER_URL"), value: Env.hidden },
      { variable: "ENGRAM_PEER_KEY", rule: hint("ENGRAM_PEER_URL"), value: Env.hidden },
    ])
    // A string may be a secret whatever the nearest variable: a password in a URL read as ENGRAM_PEER_URL's.
    for (const secret of ["s3cret", "short", "hunter2pw", "peer-sekret"]) expect(error?.message).not.toContain(secret)
  })

  it("every bad value is reported with its variable and rule", () => {
    const r = Config.parse({
      ENGRAM_PORT: "70000",
      ENGRAM_CPU_OVERCOMMIT: "0",
      ENGRAM_MAX_ENTRIES_PER_NODE: "2.5",
      ENGRAM_REQUIRE_MEASURED: "maybe",
      ENGRAM_REAPER_INTERVAL_MS: "soon",
      ENGRAM_DATABASE_URL: "mysql://x",
      ENGRAM_ADMIN_TOKEN: "short",
    })
    expect(r._tag).toBe("Invalid")
    if (r._tag !== "Invalid") return
    const byVar = Object.fromEntries(r.issues.map((i) => [i.variable, i.rule]))
    expect(byVar).toEqual({
      ENGRAM_PORT: "must be an integer from 0 to 65535",
      ENGRAM_CPU_OVERCOMMIT: CPU_RULE,
      ENGRAM_MAX_ENTRIES_PER_NODE: "must be an integer from 1 to 100000 (far more VMs than one host runs)",
      ENGRAM_REQUIRE_MEASURED: Config.booleanRule,
      ENGRAM_REAPER_INTERVAL_MS: "must be an integer from 1 to 3600000 (an hour: stale reservations, parks and starving sessions wait a pass)",
      ENGRAM_DATABASE_URL: "must be a postgres:// or postgresql:// URL",
      ENGRAM_ADMIN_TOKEN: "must be at least 16 characters",
    })
    // Secrets are never echoed.
    expect(r.issues.find((i) => i.variable === "ENGRAM_ADMIN_TOKEN")?.value).toBe("<hidden>")
  })

  it("an admin or metrics token of whitespace only, or with whitespace around it (a newline from a secret file), is refused at start naming the variable and the rule, its value hidden; the agents' peer secret's rule", async () => {
    const around = (what: string) => `must not begin or end with whitespace (a newline copied from a file: no ${what} can present it (HTTP drops whitespace around a header's value) and every ${what === "request" ? "call" : what} fails with 401)`
    for (const [value, admin, metrics] of [
      [" ".repeat(16), "must not be whitespace only", "must not be whitespace only"],
      ["\t\n".repeat(10), "must not be whitespace only", "must not be whitespace only"],
      ["abcdefghijklmnopq\n", around("request"), around("scrape")],
      [" abcdefghijklmnopq", around("request"), around("scrape")],
      ["abcdefghijklmnopq\r\n", around("request"), around("scrape")],
    ] as const) {
      const r = Config.parse({ ENGRAM_ADMIN_TOKEN: value, ENGRAM_METRICS_TOKEN: value })
      expect(r._tag === "Invalid" && r.issues.map((i) => [i.variable, i.rule, i.value]), JSON.stringify(value)).toEqual([
        ["ENGRAM_ADMIN_TOKEN", admin, Env.hidden],
        ["ENGRAM_METRICS_TOKEN", metrics, Env.hidden],
      ])
      // A program's settings (`startCoordinator({ config })`) by the same rule.
      const p = Config.parseInput({ adminToken: value, metricsToken: Redacted.make(value) })
      expect(p._tag === "Invalid" && p.issues.map((i) => [i.variable, i.rule]), JSON.stringify(value)).toEqual([
        ["adminToken", admin],
        ["metricsToken", metrics],
      ])
    }
    // Whitespace within a token is its own business; 16 characters are still the least.
    expect(Config.parse({ ENGRAM_ADMIN_TOKEN: "abcdefgh ijklmnop", ENGRAM_METRICS_TOKEN: "scrape-token-0123456789" })._tag).toBe("Valid")
    const short = Config.parse({ ENGRAM_ADMIN_TOKEN: "short\n" })
    expect(short._tag === "Invalid" && short.issues.map((i) => i.rule)).toEqual(["must be at least 16 characters"])
  })

  it("a JSON file under the environment; unknown keys refused", async () => {
    const dir = mkdtempSync(join(tmpdir(), "engram-config-"))
    const file = join(dir, "c.json")
    writeFileSync(file, JSON.stringify({ ENGRAM_PORT: 1234, ENGRAM_MEM_OVERCOMMIT_RATIO: 1.5, ENGRAM_HOST: "0.0.0.0" }))
    const config = await Effect.runPromise(Config.fromEnvironment({ ENGRAM_CONFIG_FILE: file, ENGRAM_HOST: "127.0.0.2" }))
    expect(config).toMatchObject({ port: 1234, host: "127.0.0.2", limits: { memOvercommitRatio: 1.5 } })
    writeFileSync(file, JSON.stringify({ ENGRAM_PROT: 1 }))
    const exit = await Effect.runPromiseExit(Config.fromEnvironment({ ENGRAM_CONFIG_FILE: file }))
    expect(Exit.isFailure(exit)).toBe(true)
    expect(String(Exit.isFailure(exit) ? exit.cause : "")).toContain("ENGRAM_PROT")
  })

  it("secrets are never echoed: a bad admin token, metrics token or database URL (also from a JSON file's numbers), a misspelt key in the file", async () => {
    const r = Config.parse({ ENGRAM_ADMIN_TOKEN: 1234567890, ENGRAM_DATABASE_URL: 42, ENGRAM_METRICS_TOKEN: "short-secret" })
    expect(r._tag).toBe("Invalid")
    if (r._tag === "Invalid") {
      expect(r.issues.map((i) => [i.variable, i.value])).toEqual([
        ["ENGRAM_DATABASE_URL", "<hidden>"],
        ["ENGRAM_ADMIN_TOKEN", "<hidden>"],
        ["ENGRAM_METRICS_TOKEN", "<hidden>"],
      ])
    }
    const dir = mkdtempSync(join(tmpdir(), "engram-config-"))
    const file = join(dir, "c.json")
    writeFileSync(file, JSON.stringify({ ENGRAM_ADMIN_TOKN: "a-secret-admin-token-0123456789" }))
    const exit = await Effect.runPromiseExit(Config.fromEnvironment({ ENGRAM_CONFIG_FILE: file }))
    expect(String(Exit.isFailure(exit) ? exit.cause : "")).toContain("ENGRAM_ADMIN_TOKN")
    expect(String(Exit.isFailure(exit) ? exit.cause : "")).not.toContain("a-secret-admin-token")
  })

  it("secrets are Redacted: the configuration can be logged whole without them", async () => {
    const config = await Effect.runPromise(
      Config.fromEnvironment({ ENGRAM_ADMIN_TOKEN: "admin-secret-0123456789", ENGRAM_METRICS_TOKEN: "scrape-secret-0123456789", ENGRAM_DATABASE_URL: "postgres://u:pw-secret@db/engram" }),
    )
    expect(config.adminToken !== null && Redacted.value(config.adminToken)).toBe("admin-secret-0123456789")
    const shown = `${JSON.stringify(config)} ${String(config.adminToken)} ${String(config.databaseUrl)}`
    for (const secret of ["admin-secret", "scrape-secret", "pw-secret"]) expect(shown).not.toContain(secret)
  })

  it("the body limit (1 MiB) and the scrape token are settings like the others", () => {
    expect(Config.defaults()).toMatchObject({ maxBodyBytes: 1048576, metricsToken: null })
    const r = Config.parse({ ENGRAM_MAX_BODY_BYTES: "65536" })
    expect(r._tag === "Valid" && r.config.maxBodyBytes).toBe(65536)
    const bad = Config.parse({ ENGRAM_MAX_BODY_BYTES: "12" })
    expect(bad._tag === "Invalid" && bad.issues).toEqual([{ variable: "ENGRAM_MAX_BODY_BYTES", rule: "must be an integer from 1024 to 1073741824", value: "12" }])
  })

  it("every problem in the environment is reported at once, in one format naming the variable and the rule", async () => {
    const exit = await Effect.runPromiseExit(
      Config.fromEnvironment({ ENGRAM_PORT: "seventy", ENGRAM_CPU_OVERCOMMIT: "0", ENGRAM_CHANGES_CHECK_MS: "1", ENGRAM_ADMIN_TOKEN: "short" }),
    )
    const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: { message: string } }).error : undefined
    expect(error?.message).toBe(
      [
        "invalid coordinator configuration:",
        '  ENGRAM_PORT="seventy": must be an integer from 0 to 65535',
        '  ENGRAM_ADMIN_TOKEN="<hidden>": must be at least 16 characters',
        '  ENGRAM_CHANGES_CHECK_MS="1": must be an integer from 100 to 60000',
        `  ENGRAM_CPU_OVERCOMMIT="0": ${CPU_RULE}`,
      ].join("\n"),
    )
  })

  it("a file's unknown key and the environment's bad values are reported together", async () => {
    const dir = mkdtempSync(join(tmpdir(), "engram-config-"))
    const file = join(dir, "c.json")
    writeFileSync(file, JSON.stringify({ ENGRAM_PROT: 1, ENGRAM_MOVE_TIMEOUT_MS: 0 }))
    const exit = await Effect.runPromiseExit(Config.fromEnvironment({ ENGRAM_CONFIG_FILE: file, ENGRAM_PORT: "-1" }))
    const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: Env.ConfigInvalid }).error : undefined
    expect(error?.issues.map((i) => i.variable)).toEqual(["ENGRAM_PROT", "ENGRAM_PORT", "ENGRAM_MOVE_TIMEOUT_MS"])
  })

  it("an ENGRAM_* variable no engram component reads is warned about by name, with the one it probably meant", async () => {
    const lines: string[] = []
    const capture = Logger.layer([Logger.make(({ logLevel, message }) => void lines.push(`${logLevel} ${String(Array.isArray(message) ? message[0] : message)}`))])
    const config = await Effect.runPromise(Config.fromEnvironment({ ENGRAM_PROT: "8080", ENGRAM_HOST_ID: "h1", ENGRAM_TEST_DATABASE_URL: "x" }).pipe(Effect.provide(capture)))
    expect(config.port).toBe(7070)
    expect(lines.filter((l) => l.startsWith("Warn"))).toEqual([
      "Warn ENGRAM_PROT is not a setting of any engram component and is ignored (did you mean ENGRAM_PORT?)",
    ])
  })

  it("every variable the coordinator reads is in @engram/api's list, so no process warns about it", () => {
    // The settings' own variables too: `Config.variables` is that list itself, and a setting
    // missing from it was warned about as unknown, and refused in a config file.
    for (const v of [...Config.variables, ...Object.values(Config.settingVariables), ...Object.keys(Config.limitVariables)]) expect(Env.knownVariables.has(v), v).toBe(true)
  })

  it("a relative data dir is resolved against INIT_CWD (the directory pnpm was run from); an absolute one is kept", async () => {
    const read = (env: Record<string, string>) => Effect.runPromise(Config.fromEnvironment(env)).then((c) => c.dataDir)
    expect(await read({ INIT_CWD: "/repo" })).toBe("/repo/.engram")
    expect(await read({ INIT_CWD: "/repo", ENGRAM_DATA_DIR: "state/db" })).toBe("/repo/state/db")
    expect(await read({ INIT_CWD: "/repo", ENGRAM_DATA_DIR: "/var/lib/engram" })).toBe("/var/lib/engram")
    expect(await read({})).toBe("./.engram")
  })
})

// A program's settings (`startCoordinator({ config })`) go through the same checks as the
// environment's: every refusal at once, each named by its settings key.
describe("a program's settings", () => {
  const day = 24 * 3_600_000
  const adminToken = "config-admin-token-0123456789"
  const invalid = async (input: Config.CoordinatorConfigInput) => {
    const exit = await Effect.runPromiseExit(Config.fromInput(input))
    const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: Env.ConfigInvalid }).error : undefined
    return error?.issues.map((i) => [i.variable, i.rule, i.value])
  }
  const valid = (input: Config.CoordinatorConfigInput) => Effect.runPromise(Config.fromInput(input))

  it("the cross-field rules hold: retention, failover grace, lease; every violation at once, named by key", async () => {
    expect(await invalid({ retentionMs: 3_599_999, reclaimGraceMs: 39_999, leaseDurationMs: 1000, leaseRenewDeadlineMs: 1000 })).toEqual([
      ["leaseRenewDeadlineMs", "must be less than leaseDurationMs (1000)", 1000],
      ["retentionMs", "must be 0 (keep history for ever) or at least allowanceHorizonMs (3600000) and makeRoomCooldownMs (600000)", 3_599_999],
      [
        "reclaimGraceMs",
        "must be 0 (no grace) or at least a third of limits.heartbeatStaleWindowMs (40000, the agents' heartbeat interval): a shorter grace ends before a live host's next heartbeat",
        39_999,
      ],
    ])
    expect(await invalid({ retentionMs: 3_600_000, makeRoomCooldownMs: 3_600_001 })).toEqual([
      ["retentionMs", "must be 0 (keep history for ever) or at least allowanceHorizonMs (3600000) and makeRoomCooldownMs (3600001)", 3_600_000],
    ])
    // The rule follows the limits passed beside it.
    expect(await invalid({ limits: { ...Limits.defaults, heartbeatStaleWindowMs: 4 * day }, reclaimGraceMs: 4 * day + 1 })).toEqual([
      ["reclaimGraceMs", `must be at most the longer of a day (86400000) and limits.heartbeatStaleWindowMs (${4 * day})`, 4 * day + 1],
    ])
  })

  it("a configuration the environment gave passes unchanged (main.ts passes it on)", async () => {
    const dir = mkdtempSync(join(tmpdir(), "engram-config-"))
    const file = join(dir, "c.json")
    writeFileSync(file, JSON.stringify({ ENGRAM_CPU_OVERCOMMIT: 2.5, ENGRAM_REQUIRE_MEASURED: true, ENGRAM_PEER_URL: "http://10.0.0.5:7070/" }))
    const fromEnv = await Effect.runPromise(
      Config.fromEnvironment({ ENGRAM_CONFIG_FILE: file, ENGRAM_ADMIN_TOKEN: adminToken, ENGRAM_DATABASE_URL: "postgres://u:pw@db/engram", ENGRAM_HEARTBEAT_STALE_WINDOW_MS: String(4 * day) }),
    )
    const again = await valid(fromEnv)
    const shown = (c: typeof fromEnv) => ({ ...c, adminToken: c.adminToken && Redacted.value(c.adminToken), databaseUrl: c.databaseUrl && Redacted.value(c.databaseUrl) })
    expect(shown(again)).toEqual(shown(fromEnv))
    expect(shown(await valid(Config.defaults()))).toEqual(shown(Config.defaults()))
  })

  it("the edge values are accepted", async () => {
    const c = await valid({ retentionMs: 3_600_000, reclaimGraceMs: 40_000, leaseDurationMs: 1000, leaseRenewDeadlineMs: 999 })
    expect([c.retentionMs, c.reclaimGraceMs, c.leaseDurationMs, c.leaseRenewDeadlineMs]).toEqual([3_600_000, 40_000, 1000, 999])
    const long = await valid({ limits: { ...Limits.defaults, heartbeatStaleWindowMs: 4 * day }, reclaimGraceMs: 4 * day })
    expect(long.reclaimGraceMs).toBe(4 * day)
    expect((await valid({ retentionMs: 0, reclaimGraceMs: 0 })).retentionMs).toBe(0)
    // Unset, the grace follows the limits passed (ENGRAM_RECLAIM_GRACE_MS's default).
    expect((await valid({ limits: { ...Limits.defaults, heartbeatStaleWindowMs: 500 } })).reclaimGraceMs).toBe(500)
  })

  it("each setting's own rule holds too, named by key (a limit as limits.<field>); an unknown key is refused; secrets are never echoed", async () => {
    const unknownKey = { reclaimGraceMS: 0 } as Config.CoordinatorConfigInput
    expect(
      await invalid({ ...unknownKey, port: -1, adminToken: "short-secret", limits: { ...Limits.defaults, cpuOvercommit: 0, heartbeatStaleWindowMs: Number.NaN } }),
    ).toEqual([
      ["reclaimGraceMS", "is not a known setting", undefined],
      ["port", "must be an integer from 0 to 65535", -1],
      ["adminToken", "must be at least 16 characters", "<hidden>"],
      ["limits.cpuOvercommit", CPU_RULE, 0],
      ["limits.heartbeatStaleWindowMs", "must be an integer from 1 to 31536000000 (a year: windows of days are in use, and every agent must take its coordinator's)", Number.NaN],
    ])
    // Nothing refused: the same values as before.
    const c = await valid({ port: 0, adminToken, peerUrl: "http://10.0.0.5:7070/" })
    expect([c.port, c.adminToken !== null && Redacted.value(c.adminToken), c.peerUrl]).toEqual([0, adminToken, "http://10.0.0.5:7070"])
  })

  it("the heartbeats' group window is checked against the limits' stale window, named by key; the edge is accepted", async () => {
    const limits = { ...Limits.defaults, heartbeatStaleWindowMs: 3000 }
    expect(await invalid({ limits, beatWindowMs: 2000 })).toEqual([
      [
        "beatWindowMs",
        "must be less than limits.heartbeatStaleWindowMs less a third of it, the agents' heartbeat interval (2000): a heartbeat held longer is written after its host may have gone stale",
        2000,
      ],
    ])
    expect((await valid({ limits, beatWindowMs: 1999 })).beatWindowMs).toBe(1999)
  })

  it("null for a setting that cannot be null is refused with the setting's own rule, never taken for its default; null keeps a nullable one unset", async () => {
    const nulls = { port: null, host: null, reclaimGraceMs: null, limits: { ...Limits.defaults, cpuOvercommit: null, requireMeasured: null } } as unknown as Config.CoordinatorConfigInput
    expect(await invalid(nulls)).toEqual([
      ["port", "must be an integer from 0 to 65535", null],
      ["host", Names.hostRule, null],
      ["reclaimGraceMs", "must be an integer >= 0", null],
      ["limits.cpuOvercommit", CPU_RULE, null],
      ["limits.requireMeasured", "must be a boolean", null],
    ])
    // The rules between settings are not judged on a refused null's default (10 s is not below 5 s).
    expect(await invalid({ leaseDurationMs: 5000, leaseRenewDeadlineMs: null } as unknown as Config.CoordinatorConfigInput)).toEqual([["leaseRenewDeadlineMs", "must be an integer from 50 to 3600000", null]])
    expect(await invalid({ limits: null } as unknown as Config.CoordinatorConfigInput)).toEqual([["limits", "must be an object of limits (leave it out for the defaults)", null]])
    const c = await valid({ databaseUrl: null, adminToken: null, metricsToken: null, peerUrl: null, otlpUrl: null, otlpHeaders: null })
    expect([c.databaseUrl, c.adminToken, c.metricsToken, c.peerUrl, c.otlpUrl, c.otlpHeaders]).toEqual([null, null, null, null, null, null])
  })

  it("startCoordinator refuses them before it opens anything, with the environment's error", async () => {
    const dataDir = join(mkdtempSync(join(tmpdir(), "engram-config-")), "data")
    const started = startCoordinator({ reaper: false, logLevel: "None", config: { port: 0, adminToken, dataDir, reclaimGraceMs: 1, retentionMs: 1 } })
    const outcome = await started.then(
      async (c) => (await c.stop(), "started"),
      (e: unknown) => e,
    )
    expect(outcome).toBeInstanceOf(Env.ConfigInvalid)
    expect((outcome as Env.ConfigInvalid).message).toBe(
      [
        "invalid coordinator configuration:",
        "  retentionMs=1: must be 0 (keep history for ever) or at least allowanceHorizonMs (3600000) and makeRoomCooldownMs (600000)",
        "  reclaimGraceMs=1: must be 0 (no grace) or at least a third of limits.heartbeatStaleWindowMs (40000, the agents' heartbeat interval): a shorter grace ends before a live host's next heartbeat",
      ].join("\n"),
    )
    // Nothing changed: no data directory made, no store opened.
    expect(existsSync(dataDir)).toBe(false)
  })
})

// One environment may serve a coordinator on PostgreSQL and one on the embedded database: the
// PostgreSQL-only settings are not refused there, but said once at start to have no effect.
describe("PostgreSQL-only settings on the embedded database", () => {
  const adminToken = "config-admin-token-0123456789"

  it("the ones set away from their defaults are named, whichever path set them", async () => {
    expect(Config.postgresOnlySet(Config.defaults())).toEqual([])
    const fromEnv = await Effect.runPromise(Config.fromEnvironment({ ENGRAM_PLACEMENT_FORWARD: "1", ENGRAM_CHANGES_CHECK_MS: "500", ENGRAM_PORT: "0" }))
    expect(Config.postgresOnlySet(fromEnv)).toEqual(["ENGRAM_CHANGES_CHECK_MS", "ENGRAM_PLACEMENT_FORWARD"])
    const fromProgram = await Effect.runPromise(Config.fromInput({ peerUrl: "http://10.0.0.5:7070", leaseDurationMs: 20_000, placementSpread: 0 }))
    expect(Config.postgresOnlySet(fromProgram)).toEqual(["ENGRAM_PLACEMENT_SPREAD", "ENGRAM_PEER_URL", "ENGRAM_LEASE_DURATION_MS"])
    expect(Config.postgresOnlyWarning(["ENGRAM_PEER_URL"])).toBe("ENGRAM_PEER_URL has no effect on the embedded database (PGlite): it applies on PostgreSQL only (ENGRAM_DATABASE_URL)")
  })

  it("a coordinator on PGlite warns once at start, naming each; with none set it says nothing", async () => {
    // Two PGlite starts: about 10 s on a quiet machine, 48 s seen in CI. Both on one data
    // directory, so the second opens it (no initdb, no migrations to run).
    const dataDir = join(mkdtempSync(join(tmpdir(), "engram-config-")), "data")
    const warningsOf = (config: Config.CoordinatorConfigInput) => {
      const lines: string[] = []
      const capture = Logger.layer([Logger.make(({ logLevel, message }) => void (logLevel === "Warn" && lines.push(String(Array.isArray(message) ? message[0] : message))))])
      return Effect.runPromise(
        Effect.scoped(Layer.build(Coordinator.layer({ reaper: false, config: { port: 0, adminToken, dataDir, pgliteWorker: 0, ...config } }))).pipe(
          Effect.provide(capture),
          Effect.map(() => lines),
        ),
      )
    }
    expect(await warningsOf({ placementForward: 1, changesCheckMs: 500 })).toEqual([
      "ENGRAM_CHANGES_CHECK_MS, ENGRAM_PLACEMENT_FORWARD have no effect on the embedded database (PGlite): they apply on PostgreSQL only (ENGRAM_DATABASE_URL)",
    ])
    expect(await warningsOf({})).toEqual([])
    // 130 s of 360 s in CI at load ≈ 30 (coordinators on PGlite started one after another).
  }, 900_000)
})

// The other way round: the embedded database's own settings given to a coordinator on PostgreSQL.
describe("embedded-only settings on PostgreSQL", () => {
  const adminToken = "config-admin-token-0123456789"

  it("the ones set away from their defaults are named", async () => {
    expect(Config.embeddedOnlySet(Config.defaults())).toEqual([])
    const fromEnv = await Effect.runPromise(Config.fromEnvironment({ ENGRAM_PGLITE_WORKER: "0", ENGRAM_PORT: "0" }))
    expect(Config.embeddedOnlySet(fromEnv)).toEqual(["ENGRAM_PGLITE_WORKER"])
    expect(Config.embeddedOnlyWarning(["ENGRAM_PGLITE_WORKER"])).toBe(
      "ENGRAM_PGLITE_WORKER has no effect on PostgreSQL (ENGRAM_DATABASE_URL is set): it applies to the embedded database (PGlite) only",
    )
  })

  it("a coordinator on PostgreSQL warns once at start; with none set it says nothing", async () => {
    const db = await freshDatabase()
    try {
      const warningsOf = (config: Config.CoordinatorConfigInput, withToken = true, dataDir = join(mkdtempSync(join(tmpdir(), "engram-config-")), "data")) => {
        const lines: string[] = []
        const capture = Logger.layer([Logger.make(({ logLevel, message }) => void (logLevel === "Warn" && lines.push(String(Array.isArray(message) ? message[0] : message))))])
        return Effect.runPromise(
          Effect.scoped(Layer.build(Coordinator.layer({ reaper: false, config: { port: 0, ...(withToken ? { adminToken } : {}), dataDir, databaseUrl: db.url, ...config } }))).pipe(
            Effect.provide(capture),
            Effect.map(() => lines),
          ),
        )
      }
      expect(await warningsOf({ pgliteWorker: 0 })).toEqual([
        "ENGRAM_PGLITE_WORKER has no effect on PostgreSQL (ENGRAM_DATABASE_URL is set): it applies to the embedded database (PGlite) only",
      ])
      expect(await warningsOf({})).toEqual([])
      // No ENGRAM_ADMIN_TOKEN: each replica would generate its own; it says so, naming the variable.
      const dataDir = join(mkdtempSync(join(tmpdir(), "engram-config-")), "data")
      const generated = await warningsOf({}, false, dataDir)
      expect(generated).toHaveLength(1)
      expect(generated[0]).toMatch(/^ENGRAM_ADMIN_TOKEN is not set: this replica uses an admin token it generated \(in .*admin-token\)\. Every coordinator replica on this database must be started with the same ENGRAM_ADMIN_TOKEN/)
      // A restart on the same data directory reads that token from its file: still its own, still said.
      expect(await warningsOf({}, false, dataDir)).toEqual(generated)
    } finally {
      await db.drop()
    }
  }, 120_000)
})
