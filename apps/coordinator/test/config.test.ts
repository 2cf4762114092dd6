// Configuration: every bad value is named with its variable and rule; the limits come from core.
import { Config } from "@engram/coordinator"
import { Limits } from "@engram/core"
import { Effect, Exit } from "effect"
import { mkdtempSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { describe, expect, it } from "vitest"

describe("configuration", () => {
  it("defaults: port 7070 on 127.0.0.1, ./.engram, PGlite, SPEC §9 limits", () => {
    expect(Config.defaults()).toMatchObject({ port: 7070, host: "127.0.0.1", dataDir: "./.engram", databaseUrl: null, adminToken: null, limits: Limits.defaults })
  })

  it("environment values are parsed and checked by Limits.make", () => {
    const r = Config.parse({ ENGRAM_PORT: "0", ENGRAM_CPU_OVERCOMMIT: "2.5", ENGRAM_REQUIRE_MEASURED: "true", ENGRAM_REAPER_INTERVAL_MS: "500" })
    expect(r._tag).toBe("Valid")
    if (r._tag === "Valid") expect(r.config).toMatchObject({ port: 0, limits: { cpuOvercommit: 2.5, requireMeasured: true, reaperIntervalMs: 500 } })
  })

  it("placements on PostgreSQL may reuse a fleet read up to 100 ms old by default; 0 asks for a fresh read", () => {
    const d = Config.parse({})
    expect(d._tag === "Valid" && d.config.placementReadMaxAgeMs).toBe(100)
    const z = Config.parse({ ENGRAM_PLACEMENT_READ_MAX_AGE_MS: "0" })
    expect(z._tag === "Valid" && z.config.placementReadMaxAgeMs).toBe(0)
    const bad = Config.parse({ ENGRAM_PLACEMENT_READ_MAX_AGE_MS: "-1" })
    expect(bad._tag === "Invalid" && bad.issues.map((i) => i.variable)).toEqual(["ENGRAM_PLACEMENT_READ_MAX_AGE_MS"])
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
      ENGRAM_CPU_OVERCOMMIT: "must be > 0",
      ENGRAM_MAX_ENTRIES_PER_NODE: "must be an integer",
      ENGRAM_REQUIRE_MEASURED: "must be a boolean",
      ENGRAM_REAPER_INTERVAL_MS: "must be an integer",
      ENGRAM_DATABASE_URL: "must be a postgres:// or postgresql:// URL",
      ENGRAM_ADMIN_TOKEN: "must be at least 16 characters",
    })
    // Secrets are never echoed.
    expect(r.issues.find((i) => i.variable === "ENGRAM_ADMIN_TOKEN")?.value).toBe("<hidden>")
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

  it("secrets are never echoed: a non-string admin token or database URL, a misspelt key in the file", async () => {
    const r = Config.parse({ ENGRAM_ADMIN_TOKEN: 1234567890123456, ENGRAM_DATABASE_URL: 42 })
    expect(r._tag).toBe("Invalid")
    if (r._tag === "Invalid") expect(r.issues.map((i) => i.value)).toEqual(["<hidden>", "<hidden>"])
    const dir = mkdtempSync(join(tmpdir(), "engram-config-"))
    const file = join(dir, "c.json")
    writeFileSync(file, JSON.stringify({ ENGRAM_ADMIN_TOKN: "a-secret-admin-token-0123456789" }))
    const exit = await Effect.runPromiseExit(Config.fromEnvironment({ ENGRAM_CONFIG_FILE: file }))
    expect(String(Exit.isFailure(exit) ? exit.cause : "")).toContain("ENGRAM_ADMIN_TOKN")
    expect(String(Exit.isFailure(exit) ? exit.cause : "")).not.toContain("a-secret-admin-token")
  })

  it("a relative data dir is resolved against INIT_CWD (the directory pnpm was run from); an absolute one is kept", async () => {
    const read = (env: Record<string, string>) => Effect.runPromise(Config.fromEnvironment(env)).then((c) => c.dataDir)
    expect(await read({ INIT_CWD: "/repo" })).toBe("/repo/.engram")
    expect(await read({ INIT_CWD: "/repo", ENGRAM_DATA_DIR: "state/db" })).toBe("/repo/state/db")
    expect(await read({ INIT_CWD: "/repo", ENGRAM_DATA_DIR: "/var/lib/engram" })).toBe("/var/lib/engram")
    expect(await read({})).toBe("./.engram")
  })
})
