import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Ref } from "effect"
import { TestClock } from "effect/testing"
import { RuntimeError, SimRuntime, type TemplateInfo, type VmRuntimeShape } from "@engram/runtime"
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

describe("a template whose build fails", () => {
  /** A runtime holding no template whose builds each wait `buildSeconds` and fail (a guest that never gets ready), or succeed once `works`. */
  const failing = (buildSeconds: number) =>
    Effect.gen(function* () {
      const sim = yield* SimRuntime.make()
      const builds = yield* Ref.make(0)
      const works = yield* Ref.make(false)
      const runtime: VmRuntimeShape = {
        ...sim,
        templates: Effect.succeed([]),
        buildTemplate: (t) =>
          Ref.update(builds, (n) => n + 1).pipe(
            Effect.andThen(Effect.sleep(`${buildSeconds} seconds`)),
            Effect.andThen(Ref.get(works)),
            Effect.flatMap((ok) =>
              ok
                ? Effect.succeed({ name: t.name, memMib: t.memMib, vcpus: t.vcpus, method: "mapped", bytes: 1 } as unknown as TemplateInfo)
                : Effect.fail(new RuntimeError({ op: "buildTemplate", vmId: `@template-${t.name}`, message: "the guest did not say it is ready" })),
            ),
          ),
      }
      return { templates: yield* Templates.make("a", runtime), builds, works }
    })

  it.effect("is built once for every session asking at once, and not again before its retry time", () =>
    Effect.gen(function* () {
      const { templates, builds, works } = yield* failing(300)
      const spec = { name: "broken", memMib: 256, vcpus: 1 }
      // Four sessions name it at once: one build, whose failure is each one's (before: four builds, one after the other).
      const asks = yield* Effect.forEach([1, 2, 3, 4], () => Effect.forkChild(Effect.result(templates.ensure(spec))))
      yield* TestClock.adjust("300 seconds")
      const answers = yield* Effect.forEach(asks, Fiber.join)
      assert.deepStrictEqual(answers.map((r) => r._tag), ["Failure", "Failure", "Failure", "Failure"])
      assert.strictEqual(yield* Ref.get(builds), 1)
      // Within the retry time (1 min) an ask fails at once, naming the last failure.
      const fast = yield* Effect.result(templates.ensure(spec))
      assert.strictEqual(fast._tag, "Failure")
      assert.match(fast._tag === "Failure" ? fast.failure.message : "", /its last build failed \(the guest did not say it is ready\); tried again in 60 s/)
      assert.strictEqual(yield* Ref.get(builds), 1)
      // Past it, a build is tried again; that one works, and the template is answered.
      yield* TestClock.adjust("61 seconds")
      yield* Ref.set(works, true)
      const again = yield* Effect.forkChild(templates.ensure(spec))
      yield* TestClock.adjust("300 seconds")
      assert.strictEqual((yield* Fiber.join(again)).name, "broken")
      assert.strictEqual(yield* Ref.get(builds), 2)
    }))

  it.effect("waits twice as long after each further failure", () =>
    Effect.gen(function* () {
      const { templates, builds } = yield* failing(1)
      const spec = { name: "broken", memMib: 256, vcpus: 1 }
      const tryAt = Effect.gen(function* () {
        const f = yield* Effect.forkChild(Effect.result(templates.ensure(spec)))
        yield* TestClock.adjust("1 second")
        return yield* Fiber.join(f)
      })
      yield* tryAt
      yield* TestClock.adjust("60 seconds")
      yield* tryAt
      assert.strictEqual(yield* Ref.get(builds), 2)
      // Now 2 min: at 61 s it is still refused without a build.
      yield* TestClock.adjust("61 seconds")
      yield* tryAt
      assert.strictEqual(yield* Ref.get(builds), 2)
      yield* TestClock.adjust("60 seconds")
      yield* tryAt
      assert.strictEqual(yield* Ref.get(builds), 3)
    }))
})
