// How long the runtime waits for a migration to end, on a TestClock: a scripted QMP client (its
// `query-migrate` answers what the test says was sent; its events are the test's).
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, PubSub, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as Monitor from "../src/Monitor.js"
import * as P from "../src/QemuProcess.js"
import type * as Qmp from "../src/Qmp.js"
import * as Host from "../src/VmHost.js"

const migrationTimeoutMs = 1500

/** A VM whose QMP client answers `query-migrate` with `sent()` bytes transferred, and whose events are `publish`ed. */
const scripted = Effect.gen(function* () {
  const events = yield* PubSub.unbounded<Qmp.QmpEvent>()
  let transferred = 0
  const client: Qmp.QmpClient = {
    socket: "scripted",
    greeting: { version: { major: 7, minor: 2, micro: 0 }, capabilities: [] },
    execute: <A>(command: string) =>
      Effect.succeed((command === "query-migrate" ? { status: "active", ram: { transferred, remaining: 1 << 20, total: 1 << 30, duplicate: 0, normal: 0 } } : {}) as A),
    subscribe: PubSub.subscribe(events),
    closed: Effect.never,
    isClosed: Effect.succeed(false),
    close: Effect.void,
  }
  const host = yield* Host.make({
    stateDir: "/nonexistent",
    binary: "qemu-system-x86_64",
    qmpTimeoutMs: 1000,
    startTimeoutMs: 1000,
    migrationTimeoutMs,
    tcgTbSizeMib: 64,
    extraArgs: [],
    snapshots: { method: "stream", reason: "scripted", ignoreShared: true },
    ramDir: undefined,
    readyLine: undefined,
    bootReadyTimeoutMs: 1000,
    resumeReadyTimeoutMs: 1000,
    testHooks: undefined,
  })
  const spec = { vmId: "v1", memMib: 64, vcpus: 1 }
  const paths = P.pathsOf("/nonexistent", spec.vmId)
  const machine: P.Machine = { boot: { kernel: "/nonexistent" }, machineType: "q35", accelerator: "tcg" }
  const monitor = Monitor.make({ client, scope: yield* Scope.make() }, events, 1000)
  const vm: Host.Vm = { spec, paths, pid: 0, client: monitor, scope: yield* Scope.make(), record: { engram: "qemu-vm/v1", spec, machine, socket: paths.socket, incomingMoveId: null }, status: "paused", endpoint: null, exited: null }
  const publish = (event: string, data: Record<string, unknown> = {}) => PubSub.publish(events, { event, data, qemuAtMs: 0, receivedAtMs: 0 })
  return { host, vm, send: (bytes: number) => void (transferred += bytes), publish }
})

describe("the wait for a migration's end", () => {
  it.effect("a save that keeps sending is waited for past migrationTimeoutMs, until QEMU says it completed", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { host, vm, send, publish } = yield* scripted
        const sub = yield* vm.client.subscribe
        const waiting = yield* Effect.forkChild(host.awaitMigrationEnd(vm, "descend", sub))
        // 10 s in all, a MiB sent every 500 ms (read between events: no event comes).
        for (let i = 0; i < 20; i++) {
          send(1 << 20)
          yield* TestClock.adjust(500)
        }
        assert.isUndefined(waiting.pollUnsafe(), "still waiting: it sends")
        yield* publish("MIGRATION", { status: "completed" })
        const end = yield* Fiber.join(waiting)
        assert.strictEqual(end.data["status"], "completed")
      }),
    ),
  )

  it.effect("a save that sends nothing for migrationTimeoutMs fails, saying so, though its passes go on", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { host, vm, send, publish } = yield* scripted
        const sub = yield* vm.client.subscribe
        send(4096)
        const waiting = yield* Effect.forkChild(host.awaitMigrationEnd(vm, "descend", sub))
        for (let i = 0; i < 14; i++) {
          yield* publish("MIGRATION_PASS", { pass: i + 1 })
          yield* TestClock.adjust(100)
        }
        assert.isUndefined(waiting.pollUnsafe(), "1.4 s without progress: still waiting")
        yield* TestClock.adjust(200)
        const exit = yield* Fiber.await(waiting)
        assert.isTrue(Exit.isFailure(exit))
        if (Exit.isFailure(exit)) assert.match(String(exit.cause), /nothing sent for 1500 ms/)
      }),
    ),
  )

  it.effect("a paused guest's final round is bounded in total, whatever it sends", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { host, vm, send } = yield* scripted
        const sub = yield* vm.client.subscribe
        const waiting = yield* Effect.forkChild(host.awaitMigrationEnd(vm, "switchover", sub, { kind: "total", ms: 300 }))
        for (let i = 0; i < 3; i++) {
          send(1 << 20)
          yield* TestClock.adjust(100)
        }
        const exit = waiting.pollUnsafe()
        assert.isDefined(exit, "ended at 300 ms")
        assert.isTrue(exit !== undefined && Exit.isFailure(exit))
        if (exit !== undefined && Exit.isFailure(exit)) assert.match(String(exit.cause), /not ended within 300 ms/)
      }),
    ),
  )
})
