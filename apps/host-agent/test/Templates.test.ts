import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Ref } from "effect"
import { TestClock } from "effect/testing"
import * as Templates from "../src/Templates.js"
import { makeFleet, type TestHost } from "./support/InProcess.js"

describe("ENGRAM_AGENT_TEMPLATES", () => {
  it("names templates as name=memMib:vcpus, and says what is wrong with a bad one", () => {
    assert.deepStrictEqual(Templates.parse(" small=256:1 ,big=1024:2"), { specs: [{ name: "small", memMib: 256, vcpus: 1 }, { name: "big", memMib: 1024, vcpus: 2 }] })
    assert.deepStrictEqual(Templates.parse(""), { specs: [] })
    assert.match((Templates.parse("small=256") as { problem: string }).problem, /must be name=memMib:vcpus/)
    assert.match((Templates.parse("a=1:1,a=2:1") as { problem: string }).problem, /names the template a twice/)
    assert.match((Templates.parse("..=256:1") as { problem: string }).problem, /a template name must be 1-100 characters/)
    assert.match((Templates.parse("z=0:1") as { problem: string }).problem, /> 0/)
  })
})

describe("a session that names a template", () => {
  const run = (template: string, memMib: number) =>
    Effect.gen(function* () {
      const fleet = yield* makeFleet([{ hostId: "a" }])
      const [a] = fleet.hosts as [TestHost]
      yield* fleet.coordinator.addSession("t1", "a", memMib, 1, template)
      for (let i = 0; i < 3; i++) {
        yield* fleet.pass
        yield* fleet.quiesce
      }
      return { fleet, a, session: (yield* fleet.coordinator.get).sessions.get("t1")! }
    })

  it.effect("starts from it; a host that does not hold it builds it first, and holds it afterwards", () =>
    Effect.gen(function* () {
      const { a, session } = yield* run("small", 512)
      assert.strictEqual(session.state, "running")
      assert.deepStrictEqual((yield* a.runtime.list).map((v) => [v.vmId, v.status]), [["t1", "running"]])
      assert.deepStrictEqual((yield* a.agent.status).templates.map((t) => [t.name, t.memMib, t.vcpus]), [["small", 512, 1]])
      assert.deepStrictEqual((yield* Ref.get(a.runtime.launches)).map((l) => [l.from, l.template]), [["template", "small"]])
    }))

  it.effect("the host report carries the templates the runtime holds", () =>
    Effect.gen(function* () {
      const { fleet, a } = yield* run("small", 512)
      yield* a.agent.reportOnce
      assert.deepStrictEqual((yield* fleet.coordinator.get).reports.get("a")?.templates, [{ name: "small", memMib: 512, vcpus: 1 }])
    }))

  it.effect("a template built here is reported at once, not at the next periodic report", () =>
    Effect.gen(function* () {
      const { fleet } = yield* run("small", 512)
      // No reportOnce here, and the report interval has not passed: the build itself reported it.
      assert.deepStrictEqual((yield* fleet.coordinator.get).reports.get("a")?.templates, [{ name: "small", memMib: 512, vcpus: 1 }])
    }))

  it.effect("a held template of another size is not used: the session boots", () =>
    Effect.gen(function* () {
      const fleet = yield* makeFleet([{ hostId: "a" }])
      const [a] = fleet.hosts as [TestHost]
      const build = yield* Effect.forkChild(a.runtime.buildTemplate({ name: "small", memMib: 256, vcpus: 1 }))
      yield* TestClock.adjust("1 minute")
      yield* Fiber.join(build)
      yield* fleet.coordinator.addSession("t1", "a", 512, 1, "small")
      for (let i = 0; i < 3; i++) {
        yield* fleet.pass
        yield* fleet.quiesce
      }
      assert.strictEqual((yield* fleet.coordinator.get).sessions.get("t1")?.state, "running")
      assert.deepStrictEqual((yield* a.agent.status).templates.map((t) => [t.name, t.memMib]), [["small", 256]], "the held template stays as it was")
      assert.deepStrictEqual((yield* Ref.get(a.runtime.launches)).map((l) => [l.from, l.template]), [["boot", null]])
    }))
})
