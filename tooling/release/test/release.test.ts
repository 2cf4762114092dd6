// The release as a user receives it. A copy of this workspace is versioned by changesets and
// published with `pnpm publish -r` to a local Verdaccio; then, outside the workspace, `npm i -g
// @engram/cli` installs the `engram` command, whose `engram coordinator` and `engram agent` run
// a one-host fleet, and a fresh project installs @engram/client, core, store, store-sim,
// store-pg and store-conformance from the registry, type-checks its own tests with `tsc` and
// runs them (fixture/): the client drives that coordinator, the conformance suite runs on a
// backend of the project's own (the conformance guide's example), store-pg runs on PGlite and
// on PostgreSQL through an outage.
import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { setTimeout as sleep } from "node:timers/promises"
import { freshDatabase, type TestDatabase } from "@engram/test-pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type Registry, startRegistry } from "../src/Registry.js"
import { cleanEnv, copyWorkspace, packagesOf, publishAll, unbuilt, versionPackages, type WorkspacePackage } from "../src/Workspace.js"

const root = resolve(import.meta.dirname, "..", "..", "..")
const fixture = resolve(import.meta.dirname, "..", "fixture")
const tmp = mkdtempSync(join(tmpdir(), "engram-release-"))
const copy = join(tmp, "workspace")
const globalPrefix = join(tmp, "global")
const app = join(tmp, "app")

let registry: Registry | undefined
let db: TestDatabase | undefined
let released: WorkspacePackage[] = []
const services: ChildProcess[] = []

/** Runs a command to its end; a failure throws with everything it printed. */
const run = (command: string, args: readonly string[], cwd: string, env: Record<string, string> = {}): string => {
  try {
    return execFileSync(command, args, { cwd, env: cleanEnv(env), encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], maxBuffer: 64 << 20 })
  } catch (e) {
    const { stdout, stderr } = e as { stdout?: string; stderr?: string }
    throw new Error(`${command} ${args.join(" ")} failed in ${cwd}:\n${stdout ?? ""}\n${stderr ?? ""}`, { cause: e })
  }
}

/** Starts a service of the installed `engram` and answers once a line matches `ready`. */
const startService = async (args: readonly string[], env: Record<string, string>, ready: RegExp): Promise<RegExpExecArray> => {
  const child = spawn(join(globalPrefix, "bin", "engram"), args, { cwd: tmp, env: cleanEnv({ ENGRAM_LOG_FORMAT: "json", ...env }), stdio: ["ignore", "pipe", "pipe"] })
  services.push(child)
  let output = ""
  child.stdout?.on("data", (b: Buffer) => (output += b.toString()))
  child.stderr?.on("data", (b: Buffer) => (output += b.toString()))
  const deadline = Date.now() + 120_000
  for (;;) {
    const m = ready.exec(output)
    if (m !== null) return m
    if (child.exitCode !== null || Date.now() > deadline) throw new Error(`engram ${args.join(" ")} did not get ready (${child.exitCode ?? "still running"}):\n${output}`)
    await sleep(100)
  }
}

beforeAll(async () => {
  const missing = unbuilt(root)
  if (missing.length > 0) throw new Error(`not built: ${missing.join(", ")}; run \`pnpm build\` first (\`pnpm test:release\` does)`)
  copyWorkspace(root, copy)
  versionPackages(root, copy)
  released = packagesOf(copy).filter((p) => p.published)
  mkdirSync(join(tmp, "registry"))
  registry = await startRegistry(join(tmp, "registry"))
  publishAll(copy, registry.npmrc, registry.url)
  db = await freshDatabase()
})

afterAll(async () => {
  for (const s of services) if (s.exitCode === null && s.signalCode === null) s.kill("SIGTERM")
  await Promise.all(services.map((s) => (s.exitCode !== null || s.signalCode !== null ? undefined : new Promise((r) => s.once("exit", r)))))
  await registry?.stop()
  await db?.drop()
  rmSync(tmp, { recursive: true, force: true })
})

describe("the release", () => {
  it("publishes every public package at its new version, each depending on the others' released versions", async () => {
    expect(released.map((p) => p.name)).toEqual(expect.arrayContaining(["@engram/client", "@engram/core", "@engram/store-pg", "@engram/store-conformance", "@engram/cli", "@engram/postgres"]))
    for (const p of released) {
      const doc = (await (await fetch(`${registry!.url}${p.name.replace("/", "%2f")}`)).json()) as { "dist-tags"?: { latest?: string }; versions?: Record<string, { dependencies?: Record<string, string> }> }
      expect(doc["dist-tags"]?.latest, p.name).toBe(p.version)
      const deps = doc.versions?.[p.version]?.dependencies ?? {}
      for (const [name, range] of Object.entries(deps)) {
        expect(range, `${p.name} → ${name}`).not.toMatch(/^workspace:/)
        const dep = released.find((r) => r.name === name)
        if (dep !== undefined) expect(range, `${p.name} → ${name}`).toBe(`^${dep.version}`)
      }
    }
  })

  it("npm i -g @engram/cli installs `engram`: engram coordinator and engram agent run a fleet, engram status reads it", async () => {
    writeFileSync(join(tmp, ".npmrc"), `registry=${registry!.url}\n`)
    const npmEnv = { npm_config_userconfig: join(tmp, ".npmrc"), npm_config_update_notifier: "false", npm_config_fund: "false", npm_config_audit: "false" }
    run("npm", ["install", "--global", "--prefix", globalPrefix, "@engram/cli"], tmp, npmEnv)
    const dataDir = join(tmp, "coordinator")
    const listening = await startService(["coordinator"], { ENGRAM_PORT: "0", ENGRAM_DATA_DIR: dataDir }, /listening on (http:\/\/127\.0\.0\.1:\d+)/)
    const url = listening[1]!
    const token = readFileSync(join(dataDir, "admin-token"), "utf8").trim()
    const host = (await (await fetch(`${url}/v1/hosts`, { method: "POST", headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: JSON.stringify({ id: "release-host" }) })).json()) as { token: string }
    await startService(
      ["agent"],
      {
        ENGRAM_COORDINATOR_URL: url,
        ENGRAM_HOST_ID: "release-host",
        ENGRAM_HOST_TOKEN: host.token,
        ENGRAM_PEER_SECRET: "release-peer-secret-0123456789",
        ENGRAM_AGENT_PORT: "0",
        ENGRAM_AGENT_MEASURE: "fixed",
        ENGRAM_AGENT_REPORT_MS: "500",
      },
      /host agent ready/,
    )
    const status = run(join(globalPrefix, "bin", "engram"), ["status"], tmp, { ENGRAM_URL: url, ENGRAM_TOKEN: token })
    expect(status).toMatch(/^hosts\s+1 \(1 ready/m)
    process.env["ENGRAM_RELEASE_URL"] = url
    process.env["ENGRAM_RELEASE_TOKEN"] = token
  })

  it("a fresh project installs the packages from the registry, type-checks its tests and passes them", () => {
    cpSync(fixture, app, { recursive: true })
    // The backend of its own: the conformance guide's example, as its guide tells an outsider.
    cpSync(join(root, "tooling", "conformance-example", "src"), join(app, "src"), { recursive: true })
    const workspaceRange = (pkg: string, dep: string) => {
      const m = JSON.parse(readFileSync(join(copy, pkg, "package.json"), "utf8")) as Record<string, Record<string, string> | undefined>
      const range = m["dependencies"]?.[dep] ?? m["devDependencies"]?.[dep] ?? m["peerDependencies"]?.[dep]
      if (range === undefined) throw new Error(`${pkg} names no ${dep}`)
      return range
    }
    const version = (name: string) => `^${released.find((p) => p.name === name)!.version}`
    writeFileSync(
      join(app, "package.json"),
      `${JSON.stringify(
        {
          name: "engram-release-check",
          private: true,
          type: "module",
          scripts: { check: "tsc -p tsconfig.json", test: "vitest run" },
          dependencies: {
            "@engram/client": version("@engram/client"),
            "@engram/core": version("@engram/core"),
            "@engram/store": version("@engram/store"),
            "@engram/store-pg": version("@engram/store-pg"),
            "@engram/store-sim": version("@engram/store-sim"),
            effect: workspaceRange("packages/client", "effect"),
          },
          devDependencies: {
            "@engram/store-conformance": version("@engram/store-conformance"),
            "@effect/vitest": workspaceRange("packages/store-conformance", "@effect/vitest"),
            "@types/node": workspaceRange("packages/client", "@types/node"),
            typescript: workspaceRange("packages/client", "typescript"),
            vitest: workspaceRange("packages/store-conformance", "vitest"),
          },
        },
        null,
        2,
      )}\n`,
    )
    writeFileSync(join(app, ".npmrc"), `registry=${registry!.url}\n`)
    const npmEnv = { npm_config_userconfig: join(app, ".npmrc"), npm_config_update_notifier: "false", npm_config_fund: "false", npm_config_audit: "false" }
    run("npm", ["install"], app, npmEnv)
    run("npm", ["run", "check"], app, npmEnv)
    const out = run("npm", ["test"], app, {
      ...npmEnv,
      ENGRAM_URL: process.env["ENGRAM_RELEASE_URL"] ?? "",
      ENGRAM_TOKEN: process.env["ENGRAM_RELEASE_TOKEN"] ?? "",
      ENGRAM_HOST_ID: "release-host",
      ENGRAM_RELEASE_PG_URL: db!.url,
      NO_COLOR: "1",
    })
    expect(out).toMatch(/Test Files\s+4 passed \(4\)/)
    expect(out).not.toMatch(/skipped/)
  })
})
