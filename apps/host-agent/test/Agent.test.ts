import { assert, describe } from "@effect/vitest"
import { Effect, Logger } from "effect"
import { TestClock } from "effect/testing"
import { ImageStore, SimRuntime } from "@engram/runtime"
import { createHash } from "node:crypto"
import { existsSync, mkdtempSync, readdirSync, readFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { makeAgent } from "../src/Agent.js"
import { defaultAgentConfig } from "../src/Host.js"
import * as ImageFetch from "../src/ImageFetch.js"
import { makeMoveTarget } from "../src/MoveTarget.js"
import * as PeerLink from "../src/PeerLink.js"
import { makeResidents } from "../src/Residents.js"
import { makeFakeCoordinator } from "./support/FakeCoordinator.js"
import { effect } from "./support/PatientClock.js"
import { makeFleet } from "./support/InProcess.js"

const fleetOf = Effect.gen(function* () {
  const fleet = yield* makeFleet([{ hostId: "a", sim: { startMs: 50 } }, { hostId: "b" }])
  const settle = Effect.gen(function* () {
    for (let i = 0; i < 3; i++) {
      yield* fleet.pass
      yield* fleet.quiesce
    }
  })
  return { ...fleet, a: fleet.hosts[0]!, b: fleet.hosts[1]!, settle }
})

describe("the agent reconciles with the coordinator's assignments", () => {
  effect("a pending session starts and is acknowledged once; repeated passes change nothing", () =>
    Effect.gen(function* () {
      const f = yield* fleetOf
      yield* f.coordinator.addSession("s1", "a", 512)
      yield* f.settle
      yield* f.settle
      const s = yield* f.coordinator.get
      assert.strictEqual(s.sessions.get("s1")?.state, "running")
      assert.deepStrictEqual(s.calls.filter((c) => c.startsWith("started")), ["started s1"])
      assert.deepStrictEqual((yield* f.a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
      assert.deepStrictEqual((yield* f.a.residents.all).map((v) => v.reservationId), ["res-s1"])
    }))

  effect("parked pauses in place; running again resumes; descending captures, frees and acknowledges", () =>
    Effect.gen(function* () {
      const f = yield* fleetOf
      yield* f.coordinator.addSession("s1", "a", 512)
      yield* f.settle
      yield* f.coordinator.setState("s1", "parked")
      yield* f.settle
      assert.deepStrictEqual((yield* f.a.runtime.list).map((v) => v.status), ["paused"])
      yield* f.coordinator.setState("s1", "running")
      yield* f.settle
      assert.deepStrictEqual((yield* f.a.runtime.list).map((v) => v.status), ["running"])
      yield* f.coordinator.setState("s1", "descending")
      yield* f.settle
      const s = yield* f.coordinator.get
      assert.strictEqual(s.sessions.get("s1")?.state, "descended")
      assert.deepStrictEqual(yield* f.a.runtime.list, [])
      assert.deepStrictEqual(yield* f.a.residents.all, [])
    }))

  effect("a resumed descended session is restored from its descent image", () =>
    Effect.gen(function* () {
      const f = yield* fleetOf
      yield* f.coordinator.addSession("s1", "a", 512)
      yield* f.settle
      yield* f.coordinator.setState("s1", "descending")
      yield* f.settle
      // Resume: descended → pending on host a again.
      yield* f.coordinator.addSession("s1", "a", 512)
      yield* f.settle
      assert.strictEqual((yield* f.coordinator.get).sessions.get("s1")?.state, "running")
      assert.deepStrictEqual((yield* f.a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"]])
    }))

  effect("a descent's image is hashed in the background once it is written: its sidecar holds each file's SHA-256 before any listing, which then answers from it", () =>
    Effect.gen(function* () {
      const f = yield* makeFleet([{ hostId: "a" }], { warmImages: true })
      const a = f.hosts[0]!
      yield* f.coordinator.addSession("s1", "a", 512)
      yield* f.settle(2)
      yield* f.coordinator.setState("s1", "descending")
      yield* f.settle(2)
      assert.strictEqual((yield* f.coordinator.get).sessions.get("s1")?.state, "descended")
      const dir = dirname(a.images.pathFor("s1"))
      const sidecar = join(dir, "~sha256.json")
      // The hashing runs beside the agent's actions (file I/O): waited for a bounded number of turns.
      for (let i = 0; i < 2000 && !existsSync(sidecar); i++) yield* Effect.promise(() => new Promise<void>((resolve) => (i < 100 ? setImmediate(resolve) : setTimeout(resolve, 10))))
      assert.isTrue(existsSync(sidecar), "the descent image's sidecar was not written")
      const kept = JSON.parse(readFileSync(sidecar, "utf8")) as Record<string, { readonly bytes: number; readonly sha256: string }>
      const files = readdirSync(dir).filter((n) => !n.startsWith("~")).sort()
      assert.deepStrictEqual(files, ["descent.json", "image"])
      for (const name of files) {
        const body = readFileSync(join(dir, name))
        assert.deepStrictEqual([kept[name]?.bytes, kept[name]?.sha256], [body.length, createHash("sha256").update(body).digest("hex")], name)
      }
      // The listing takes the sidecar's hashes (a file changed since would be hashed again).
      const listed = yield* ImageFetch.listing(a.images, "s1")
      assert.deepStrictEqual(listed?.files.map((x) => [x.name, x.sha256]), files.map((n) => [n, kept[n]!.sha256]))
    }))

  effect("the background hashing of a descent image asks whether the session is still descended with its image here: not once it is restored, nor once its image is removed", () =>
    Effect.gen(function* () {
      // The agent's question, kept (the hashing itself answers at once).
      const asked = new Map<string, Effect.Effect<boolean>>()
      const f = yield* makeFleet([{ hostId: "a" }], {
        warmImage: (_hostId, sessionId, goOn) => Effect.sync(() => void asked.set(sessionId, goOn)).pipe(Effect.as({ files: 0, bytes: 0, stopped: false })),
      })
      const a = f.hosts[0]!
      yield* f.coordinator.addSession("s1", "a", 512)
      yield* f.settle(2)
      yield* f.coordinator.setState("s1", "descending")
      yield* f.settle(2)
      assert.strictEqual((yield* f.coordinator.get).sessions.get("s1")?.state, "descended")
      const goOn = asked.get("s1")
      assert.isDefined(goOn, "the agent asked for no hashing of s1's image")
      // Descended, its image here: go on.
      assert.isTrue(yield* goOn!)
      // Resumed here: restored from its image (resident, the image then removed): stop.
      yield* f.coordinator.addSession("s1", "a", 512)
      yield* f.settle(2)
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => v.vmId), ["s1"])
      assert.isFalse(yield* goOn!)
      // Descended again, then its image removed: stop.
      yield* f.coordinator.setState("s1", "descending")
      yield* f.settle(2)
      const again = asked.get("s1")!
      assert.isTrue(yield* again)
      yield* a.images.remove("s1")
      assert.isFalse(yield* again)
    }))

  effect("a VM the coordinator no longer assigns here (ended or lost) is destroyed", () =>
    Effect.gen(function* () {
      const f = yield* fleetOf
      yield* f.coordinator.addSession("s1", "a", 512)
      yield* f.settle
      yield* f.coordinator.setState("s1", "lost")
      yield* f.settle
      assert.deepStrictEqual(yield* f.a.runtime.list, [])
      assert.deepStrictEqual(yield* f.a.residents.all, [])
    }))

  effect("sessions taken from a host whose heartbeats went unanswered past the stale window: one warning naming them (reclaimed as stale) before their VMs go; an ordinary end gives none", () => {
    const warnings: { readonly text: string; readonly fields: Record<string, unknown> }[] = []
    const capture = Logger.layer([
      Logger.make(({ logLevel, message }) => {
        const [text, fields] = Array.isArray(message) ? message : [message]
        // Only the reclaim warning (another warning, such as a fake runtime's, is not this test's).
        if (logLevel === "Warn" && String(text).includes("reclaimed")) warnings.push({ text: String(text), fields: (fields ?? {}) as Record<string, unknown> })
      }),
    ])
    return Effect.gen(function* () {
      const f = yield* fleetOf
      // Passes as the agent runs them, a heartbeat answered before each (the clock moves a minute a pass).
      const beating = Effect.gen(function* () {
        for (let i = 0; i < 3; i++) {
          yield* f.a.agent.heartbeatOnce
          yield* f.pass
          yield* f.quiesce
        }
      })
      yield* f.a.agent.heartbeatOnce
      yield* f.coordinator.addSession("s1", "a", 512)
      yield* f.coordinator.addSession("s2", "a", 512)
      yield* f.coordinator.addSession("s3", "a", 512)
      yield* beating
      // Ended while heartbeats are answered: no warning.
      yield* f.coordinator.setState("s3", "ended")
      yield* beating
      assert.deepStrictEqual(warnings.map((w) => w.text), [])
      assert.deepStrictEqual((yield* f.a.runtime.list).map((v) => v.vmId), ["s1", "s2"])
      // No heartbeat answered for 3 min (the window is 2 min: the agent frozen, say): the coordinator
      // reclaimed s1 and s2. The agent's first heartbeat after is answered before its next pass.
      yield* TestClock.adjust("3 minutes")
      yield* f.coordinator.setState("s1", "lost")
      yield* f.coordinator.setState("s2", "lost")
      yield* beating
      assert.deepStrictEqual(yield* f.a.runtime.list, [])
      assert.deepStrictEqual(
        warnings.map((w) => [w.text.replace(/for \d+ ms/, "for N ms"), w.fields["sessions"]]),
        [
          [
            "this host's reservations were reclaimed as stale: no heartbeat of this agent was answered for N ms, longer than the coordinator's stale window (120000 ms; the agent or its host was frozen, or cut off); its sessions here are lost and their VMs are destroyed",
            ["s1", "s2"],
          ],
        ],
      )
    }).pipe(Effect.provide(capture))
  })

  effect("a failed action is retried on the coordinator's view read then, not on the last poll's: through an outage, a move that ended is not run again; the retry still comes without a pass", () =>
    Effect.gen(function* () {
      const f = yield* fleetOf
      yield* f.coordinator.addSession("s1", "a", 512)
      yield* f.settle
      // A move the source refuses at once (a budget under the commit allowance alone): it aborts it.
      yield* f.coordinator.beginMove("m1", "s1", "b", 100)
      yield* f.coordinator.addSession("s2", "a", 512)
      const view = yield* f.coordinator.assignmentsOf("a")
      yield* f.a.agent.reconcile(view)
      // The move ends (aborted); s2 starts (50 ms) while the coordinator cannot be reached, so its
      // acknowledgement fails and is retried. The last view this agent saw still shows the move pending.
      yield* TestClock.adjust("10 millis")
      assert.strictEqual((yield* f.coordinator.get).moves.get("m1")?.state, "aborted")
      yield* f.coordinator.silence("a", true)
      const retryMs = defaultAgentConfig("a").retryDelayMs
      for (let i = 0; i < 5; i++) yield* TestClock.adjust(retryMs)
      yield* f.coordinator.silence("a", false)
      // No pass: only the agent's own retry looks again.
      for (let i = 0; i < 3; i++) yield* TestClock.adjust(retryMs)
      yield* f.quiesce
      const moves = (yield* f.a.agent.status).moves.filter((m) => m.moveId === "m1").map((m) => m._tag)
      assert.deepStrictEqual(moves, ["Refused"], "the aborted move ran once")
      const s = yield* f.coordinator.get
      assert.deepStrictEqual(s.calls.filter((c) => c.startsWith("started s2")), ["started s2"], "the failed acknowledgement was retried without a pass")
      assert.deepStrictEqual((yield* f.a.runtime.list).map((v) => [v.vmId, v.status]), [["s1", "running"], ["s2", "running"]])
    }))

  effect("heartbeats and reports run on their intervals", () =>
    Effect.gen(function* () {
      const f = yield* fleetOf
      yield* Effect.forkChild(f.a.agent.run)
      yield* TestClock.adjust("2 minutes")
      const s = yield* f.coordinator.get
      // Stale window 2 min → a heartbeat at 0 s, then never more than 40 s after the last (the
      // second at a random point of the first 40 s, each next one 36-40 s later): 4 or more
      // (0, 40, 80, 120 at the latest), and at most 5 (0, 0, 36, 72, 108 at the earliest; 144 is past 2 min).
      assert.isAtLeast(s.heartbeats.get("a") ?? 0, 4)
      assert.isAtMost(s.heartbeats.get("a") ?? 0, 5)
      assert.deepStrictEqual(s.reports.get("a"), { totalMib: 16384, allocatableMib: 15360, totalVcpus: 8, templates: [] })
    }))

  effect("the report names the sessions whose guest did work since the last report (its CPU time grew), and only those", () =>
    Effect.gen(function* () {
      // Modeled guests: busy for 30 s after they start, resume or are touched, then quiet.
      const f = yield* fleetOf
      yield* f.coordinator.addSession("busy", "a", 256)
      yield* f.coordinator.addSession("quiet", "a", 256)
      yield* f.settle
      assert.deepStrictEqual((yield* f.a.runtime.list).map((v) => v.status), ["running", "running"])
      // The first report reads each guest's CPU time: nothing to compare with yet.
      yield* f.a.agent.reportOnce
      yield* f.a.runtime.touch("busy")
      yield* f.a.runtime.touch("quiet")
      yield* TestClock.adjust("1 minute")
      yield* f.a.agent.reportOnce
      yield* TestClock.adjust("1 minute")
      yield* f.a.runtime.touch("busy")
      yield* TestClock.adjust("10 seconds")
      yield* f.a.agent.reportOnce
      // The touched guest works out its 30 s, then both are quiet for a whole interval.
      yield* TestClock.adjust("1 minute")
      yield* f.a.agent.reportOnce
      yield* TestClock.adjust("1 minute")
      yield* f.a.agent.reportOnce
      const s = yield* f.coordinator.get
      assert.deepStrictEqual(
        s.activity.filter((x) => x.hostId === "a").map((x) => [...x.activeSessions].sort()),
        [[], ["busy", "quiet"], ["busy"], ["busy"], []],
      )
    }))

  effect("the report adds the RAM the resident VMs hold that MemAvailable does not count (not a RAM file's page cache), not their sizes, to what the host has available (SPEC §1)", () =>
    Effect.gen(function* () {
      const MiB = 1024 * 1024
      const sim = yield* SimRuntime.make({ startMs: 0 })
      // A 512 MiB guest holding 300 MiB outside the page cache (its RSS also counts 150 MiB of
      // its RAM file's pages, which MemAvailable has already); a second whose figures cannot be
      // read (its process just went); a third whose runtime knows only its RSS.
      const runtime = {
        ...sim,
        usage: Effect.map(sim.usage, (vms) =>
          vms.map((v) =>
            v.vmId === "s1"
              ? { ...v, rssBytes: 450 * MiB, ramBytes: 300 * MiB }
              : v.vmId === "s3"
                ? { ...v, rssBytes: 20 * MiB, ramBytes: null }
                : { ...v, rssBytes: null, ramBytes: null },
          ),
        ),
      }
      yield* runtime.start({ vmId: "s1", memMib: 512, vcpus: 1 })
      yield* runtime.start({ vmId: "s2", memMib: 256, vcpus: 1 })
      yield* runtime.start({ vmId: "s3", memMib: 256, vcpus: 1 })
      const seen: number[] = []
      const coordinator = yield* makeFakeCoordinator
      const residents = yield* makeResidents("a", null, () => Effect.void)
      const agent = yield* makeAgent(defaultAgentConfig("a"), {
        coordinator: coordinator.client("a"),
        runtime,
        measure: (residentMib) => Effect.sync(() => void seen.push(residentMib)).pipe(Effect.as({ totalMib: 8192, allocatableMib: 4000 + residentMib, totalVcpus: 4 })),
        residents,
        images: ImageStore.directory(mkdtempSync(join(tmpdir(), "engram-images-"))),
        link: PeerLink.inMemory(new Map()),
        target: yield* makeMoveTarget("a", runtime, residents),
      })
      yield* agent.reportOnce
      assert.deepStrictEqual(seen, [320])
      assert.deepStrictEqual((yield* coordinator.get).reports.get("a"), { totalMib: 8192, allocatableMib: 4320, totalVcpus: 4, templates: [] })
    }))
})

