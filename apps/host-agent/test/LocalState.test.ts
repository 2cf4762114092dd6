import { existsSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as LocalState from "../src/LocalState.js"

const dir = () => mkdtempSync(join(tmpdir(), "engram-state-"))

describe("the local state file", () => {
  it.effect("saves atomically and loads back", () =>
    Effect.gen(function* () {
      const path = join(dir(), "agent.json")
      const state: LocalState.StateFile = {
        ...LocalState.empty("h1"),
        vms: [{ vmId: "s1", memMib: 512, vcpus: 1, status: "paused", reservationId: "r1", moveId: null }],
      }
      yield* LocalState.save(path, state)
      assert.deepStrictEqual(readdirSync(join(path, "..")), ["agent.json"], "no temp file left")
      const loaded = yield* LocalState.load(path, "h1")
      assert.strictEqual(loaded._tag, "Loaded")
      if (loaded._tag === "Loaded") assert.deepStrictEqual(loaded.state, state)
    }))

  it.effect("keeps the reports of lost guests the coordinator has not heard yet; a file of an older agent (none) loads without them", () =>
    Effect.gen(function* () {
      const path = join(dir(), "agent.json")
      const state: LocalState.StateFile = { ...LocalState.empty("h1"), lostReports: [{ sessionId: "s1", reason: "VM exited while the agent ran (its hypervisor crashed or was killed); booted fresh" }] }
      yield* LocalState.save(path, state)
      const loaded = yield* LocalState.load(path, "h1")
      assert.strictEqual(loaded._tag, "Loaded")
      if (loaded._tag === "Loaded") assert.deepStrictEqual(loaded.state, state)
      const older = join(dir(), "older.json")
      writeFileSync(older, JSON.stringify(LocalState.empty("h1")))
      const old = yield* LocalState.load(older, "h1")
      assert.strictEqual(old._tag, "Loaded")
      if (old._tag === "Loaded") assert.isUndefined(old.state.lostReports)
    }))

  it.effect("a missing file is Missing", () =>
    Effect.gen(function* () {
      assert.strictEqual((yield* LocalState.load(join(dir(), "none.json"), "h1"))._tag, "Missing")
    }))

  it.effect("a file that exists but cannot be read (here a directory) fails the load naming ENGRAM_AGENT_STATE_FILE: starting empty would write over the VMs it records", () =>
    Effect.gen(function* () {
      const path = dir()
      const failed = yield* Effect.flip(LocalState.load(path, "h1"))
      assert.strictEqual(failed._tag, "ConfigInvalid")
      assert.strictEqual(failed.issues[0]?.variable, "ENGRAM_AGENT_STATE_FILE")
      assert.match(failed.issues[0]?.rule ?? "", /cannot be read \(EISDIR/)
    }))

  it.effect("a corrupt file is quarantined, not trusted", () =>
    Effect.gen(function* () {
      const d = dir()
      const path = join(d, "agent.json")
      writeFileSync(path, '{"version":1,"hostId":"h1","vms":[{"vmId":')
      const loaded = yield* LocalState.load(path, "h1")
      assert.strictEqual(loaded._tag, "Quarantined")
      assert.isFalse(existsSync(path))
      if (loaded._tag === "Quarantined") assert.include(readFileSync(loaded.movedTo, "utf8"), '"vmId":')
    }))

  it.effect("a file of another host or shape is quarantined", () =>
    Effect.gen(function* () {
      const path = join(dir(), "agent.json")
      writeFileSync(path, JSON.stringify(LocalState.empty("other")))
      assert.strictEqual((yield* LocalState.load(path, "h1"))._tag, "Quarantined")
      writeFileSync(path, JSON.stringify({ version: 1, hostId: "h1", vms: [{ vmId: 3 }], pendingCommits: [] }))
      assert.strictEqual((yield* LocalState.load(path, "h1"))._tag, "Quarantined")
    }))

  it.effect("a move outcome owed before the target confirmed its commit round-trips; a file of an older agent (phases, no target) still loads", () =>
    Effect.gen(function* () {
      const path = join(dir(), "agent.json")
      const state: LocalState.StateFile = {
        ...LocalState.empty("h1"),
        pendingCommits: [
          { moveId: "m1", sessionId: "s1", phases: null, target: { targetHostId: "h2", memMib: 512, vcpus: 1 }, pause: { pausedAtMs: 1000.25, captureMs: 1.5, sendMs: 7, sentAtMs: 1010 } },
        ],
      }
      yield* LocalState.save(path, state)
      const loaded = yield* LocalState.load(path, "h1")
      assert.strictEqual(loaded._tag, "Loaded")
      if (loaded._tag === "Loaded") assert.deepStrictEqual(loaded.state, state)
      const older: LocalState.StateFile = { version: 1, hostId: "h1", vms: [], pendingCommits: [{ moveId: "m0", sessionId: "s0", phases: { downtimeMs: 546, captureMs: 40, sendMs: 86, commitMs: 420 } }] }
      writeFileSync(path, JSON.stringify(older))
      const old = yield* LocalState.load(path, "h1")
      assert.strictEqual(old._tag, "Loaded")
      if (old._tag === "Loaded") assert.deepStrictEqual(old.state, older)
    }))
})

