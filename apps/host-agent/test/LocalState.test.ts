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

  it.effect("a missing file is Missing", () =>
    Effect.gen(function* () {
      assert.strictEqual((yield* LocalState.load(join(dir(), "none.json"), "h1"))._tag, "Missing")
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
})
