/**
 * Templates (SPEC §13): a session's template is stored and read back; the templates a host
 * reports are kept with its report; placement prefers a host holding the session's template
 * (same name and size: core's ranking) but never needs one; bad names and bad reports are
 * refused by name and change nothing.
 */
import { Names } from "@engram/core"
import { expect } from "@effect/vitest"
import { Effect } from "effect"
import { addHost, expectFailure, kase, reportFor, store } from "../Harness.js"
import type { Group } from "../Harness.js"

const budget = { memMib: 1024, vcpus: 1 }
const py = { name: "py", memMib: 1024, vcpus: 1 }

/** Registers a host of `capacityMib` that reports holding `templates`. */
const addHolder = (id: string, capacityMib: number, templates: readonly { name: string; memMib: number; vcpus: number }[]) =>
  Effect.gen(function* () {
    const s = yield* store
    yield* s.registerHost({ id })
    return yield* s.reportHost(id, { ...reportFor(capacityMib, 8, s.limits()), templates })
  })

export const templates: Group = {
  name: "templates",
  cases: [
    kase(
      "a template given at create is stored and read back, placed or queued; without one a session has none",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        const o = yield* s.createSession({ id: "s1", budget, template: "py" })
        expect(o._tag).toBe("Placed")
        expect(o.session.template).toBe("py")
        expect((yield* s.getSession("s1")).template).toBe("py")
        expect((yield* s.createSession({ id: "s2", budget })).session.template).toBeNull()
        const q = yield* s.createSession({ id: "big", budget: { memMib: 1 << 20, vcpus: 1 }, template: "big.v2" })
        expect(q._tag).toBe("Queued")
        expect((yield* s.getSession("big")).template).toBe("big.v2")
        expect(Object.fromEntries((yield* s.listSessions()).map((x) => [x.id, x.template]))).toStrictEqual({ s1: "py", s2: null, big: "big.v2" })
      }),
    ),
    kase(
      "a host's report keeps the templates it holds; a later report replaces them",
      Effect.gen(function* () {
        const s = yield* store
        const view = yield* addHolder("h1", 8192, [py, { name: "go", memMib: 512, vcpus: 2 }])
        expect(view.report?.templates).toStrictEqual([py, { name: "go", memMib: 512, vcpus: 2 }])
        expect((yield* s.getHost("h1")).report?.templates).toStrictEqual([py, { name: "go", memMib: 512, vcpus: 2 }])
        yield* s.reportHost("h1", reportFor(8192, 8, s.limits()))
        expect((yield* s.getHost("h1")).report?.templates).toStrictEqual([])
      }),
    ),
    kase(
      "a host holding the session's template is preferred over a better fit; one of another size is not",
      Effect.gen(function* () {
        const s = yield* store
        // h1 is the best fit (least free RAM); h2 holds py at the session's size; h3 holds py at another size.
        yield* addHost("h1", 4096)
        yield* addHolder("h2", 16384, [py])
        yield* addHolder("h3", 8192, [{ name: "py", memMib: 2048, vcpus: 1 }])
        expect((yield* s.createSession({ id: "plain", budget })).session.hostId).toBe("h1")
        expect((yield* s.createSession({ id: "t", budget, template: "py" })).session.hostId).toBe("h2")
        expect((yield* s.createSession({ id: "t2", budget: { memMib: 2048, vcpus: 1 }, template: "py" })).session.hostId).toBe("h3")
        // Affinity still ranks above the template.
        expect((yield* s.createSession({ id: "a", budget, template: "py", affinity: ["h1"] })).session.hostId).toBe("h1")
      }),
    ),
    kase(
      "a host without the template still takes the session when it is the only fit",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 4096)
        yield* addHolder("h2", 512, [py])
        const o = yield* s.createSession({ id: "t", budget, template: "py" })
        expect(o._tag).toBe("Placed")
        expect(o.session.hostId).toBe("h1")
      }),
    ),
    kase(
      "a queued session with a template is drained to a host holding it",
      Effect.gen(function* () {
        const s = yield* store
        const q = yield* s.createSession({ id: "t", budget, template: "py" })
        expect(q._tag).toBe("Queued")
        yield* addHost("h1", 4096)
        yield* addHolder("h2", 16384, [py])
        yield* s.drainQueue()
        expect((yield* s.getSession("t")).hostId).toBe("h2")
      }),
    ),
    kase(
      "bad template names are refused naming template and the rule, and store nothing",
      Effect.gen(function* () {
        const s = yield* store
        yield* addHost("h1", 8192)
        for (const template of ["", ".hidden", "..", "a/b", "with space", "x".repeat(101), "nul\u0000"]) {
          const e = yield* expectFailure(s.createSession({ id: "bad", budget, template }), "InvalidInput")
          expect(e.field).toBe("template")
          expect(e.rule).toBe(Names.templateNameRule)
        }
        yield* expectFailure(s.getSession("bad"), "NotFound")
        expect(yield* s.listSessions()).toStrictEqual([])
      }),
    ),
    kase(
      "a report with bad templates is refused naming the field, and changes nothing",
      Effect.gen(function* () {
        const s = yield* store
        const before = yield* addHolder("h1", 8192, [py])
        const report = reportFor(4096, 8, s.limits())
        for (const [templates, field] of [
          [[{ name: ".x", memMib: 1024, vcpus: 1 }], "templates.0.name"],
          [[py, { name: "py", memMib: 512, vcpus: 1 }], "templates.1.name"],
          [[{ name: "go", memMib: 0, vcpus: 1 }], "templates.0.memMib"],
          [[{ name: "go", memMib: 1.5, vcpus: 1 }], "templates.0.memMib"],
          [[{ name: "go", memMib: 512, vcpus: -1 }], "templates.0.vcpus"],
          [[null], "templates.0"],
        ] as const) {
          // eslint-disable-next-line @typescript-eslint/no-explicit-any -- a bad report as a client might send it
          const e = yield* expectFailure(s.reportHost("h1", { ...report, templates: templates as any }), "InvalidInput")
          expect(e.field).toBe(field)
        }
        const after = yield* s.getHost("h1")
        expect(after.report).toStrictEqual(before.report)
        expect(after.headroom).toStrictEqual(before.headroom)
      }),
    ),
  ],
}
