// Where stopping the agent would end its guests too (Supervision): a systemd service that kills
// its whole cgroup, the first process of a PID namespace (a container's). Real /proc and
// cgroup texts as Linux writes them; systemd asked through a function (no unit runs here).
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Supervision from "../src/Supervision.js"

const v2 = "0::/system.slice/engram-agent.service\n"
const v1 = "12:memory:/system.slice/engram-agent.service\n1:name=systemd:/system.slice/engram-agent.service\n0::/\n"

describe("the supervisor the agent runs under", () => {
  it("serviceOf: the systemd service of /proc/self/cgroup (v2 and v1), none outside one", () => {
    assert.strictEqual(Supervision.serviceOf(v2), "engram-agent.service")
    assert.strictEqual(Supervision.serviceOf(v1), "engram-agent.service")
    assert.strictEqual(Supervision.serviceOf("0::/user.slice/user-0.slice/session-3.scope\n"), undefined)
    assert.strictEqual(Supervision.serviceOf("0::/\n"), undefined)
    // A terminal of a desktop session: the user's manager's unit is not the agent's.
    assert.strictEqual(Supervision.serviceOf("0::/user.slice/user-1000.slice/user@1000.service/app.slice/vte-spawn-1.scope\n"), undefined)
    assert.strictEqual(Supervision.serviceOf("0::/user.slice/user-1000.slice/user@1000.service\n"), undefined)
    assert.strictEqual(Supervision.serviceOf(""), undefined)
  })

  it.effect("a service whose KillMode is not process, or that cannot be asked, is warned about; KillMode=process is not", () =>
    Effect.gen(function* () {
      const asked: string[] = []
      const ask = (mode: string | undefined) => (unit: string) => (asked.push(unit), Promise.resolve(mode))
      const control = yield* Supervision.check(4242, () => Promise.resolve(v2), ask("control-group"))
      assert.deepStrictEqual(control.warnings.map((w) => w.fields), [{ unit: "engram-agent.service", killMode: "control-group" }])
      assert.match(control.warnings[0]!.message, /KillMode=control-group: stopping or restarting the service ends its guests too .* set KillMode=process/)
      assert.deepStrictEqual((yield* Supervision.check(4242, () => Promise.resolve(v1), ask(undefined))).warnings.map((w) => w.fields), [{ unit: "engram-agent.service", killMode: null }])
      assert.deepStrictEqual((yield* Supervision.check(4242, () => Promise.resolve(v2), ask("process"))).warnings, [])
      assert.deepStrictEqual(asked, ["engram-agent.service", "engram-agent.service", "engram-agent.service"])
    }))

  it.effect("the first process of a PID namespace is warned about; outside a service nothing is asked of systemd", () =>
    Effect.gen(function* () {
      const asked: string[] = []
      const first = yield* Supervision.check(1, () => Promise.resolve("0::/\n"), (unit) => (asked.push(unit), Promise.resolve(undefined)))
      assert.deepStrictEqual(first.warnings.map((w) => w.fields), [{ pid: 1 }])
      assert.match(first.warnings[0]!.message, /first process of its PID namespace .* its guests end when it does/)
      assert.deepStrictEqual((yield* Supervision.check(4242, () => Promise.reject(new Error("no /proc")), () => Promise.resolve(undefined))).warnings, [])
      assert.deepStrictEqual(asked, [])
    }))

})
