// The QMP client against a real QEMU (a machine with no board boots at once) and, for a
// monitor that never answers, a unix socket server that only greets.
import { spawn } from "node:child_process"
import { mkdtempSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schedule } from "effect"
import { QemuProcess, Qmp } from "../src/index.js"
import { runQemuTests } from "./support/Qemu.js"

/** A QEMU with `-machine none` and its QMP socket; killed with the scope. */
const bareQemu = Effect.acquireRelease(
  Effect.gen(function* () {
    const socket = join(mkdtempSync(join(tmpdir(), "eq-qmp-")), "q.sock")
    const child = spawn("qemu-system-x86_64", ["-machine", "none", "-nodefaults", "-display", "none", "-qmp", `unix:${socket},server=on,wait=off`], { stdio: "ignore" })
    const client = yield* Qmp.connect(socket, { timeoutMs: 5000 }).pipe(Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 200 }))
    return { socket, child, client }
  }),
  ({ child }) => Effect.sync(() => void child.kill("SIGKILL")),
)

describe.skipIf(!runQemuTests)("the QMP client on a real QEMU (needs qemu-system-x86_64: CI installs it; skipped elsewhere without it)", () => {
  it.live("negotiates, runs commands by id, and answers QEMU's errors as QmpError", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { client } = yield* bareQemu
        assert.isTrue(client.greeting.version.major >= 7)
        const [a, b] = yield* Effect.all([client.execute<{ status: string }>("query-status"), client.execute<{ name?: string }>("query-name")], { concurrency: 2 })
        assert.isString(a.status)
        assert.isObject(b)
        const e = yield* client.execute("no-such-command").pipe(Effect.flip)
        assert.strictEqual(e._tag, "QmpError")
        if (e._tag === "QmpError") assert.strictEqual(e.errorClass, "CommandNotFound")
      }),
    ))

  it.live("publishes events with QEMU's timestamp and the time they arrived", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { client } = yield* bareQemu
        const sub = yield* client.subscribe
        yield* client.execute("stop")
        const stop = yield* Qmp.awaitEvent(sub, (e) => (e.event === "STOP" ? e : undefined), 10_000, "STOP")
        assert.isTrue(stop.qemuAtMs > 1_600_000_000_000)
        assert.isTrue(stop.receivedAtMs > 0)
        yield* client.execute("cont")
        yield* Qmp.awaitEvent(sub, (e) => (e.event === "RESUME" ? e : undefined), 10_000, "RESUME")
      }),
    ))

  it.live("a QEMU that quits closes the client: pending and later commands fail as QmpClosed", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const { client, child } = yield* bareQemu
        yield* client.execute("quit")
        yield* client.closed
        assert.isTrue(yield* client.isClosed)
        const e = yield* client.execute("query-status").pipe(Effect.flip)
        assert.strictEqual(e._tag, "QmpClosed")
        assert.isTrue(yield* QemuProcess.awaitExit(child.pid!, 10_000))
      }),
    ))
})

describe("the QMP client's failures", () => {
  it.live("a monitor that greets but never answers times the command out", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const socket = join(mkdtempSync(join(tmpdir(), "eq-qmp-")), "mute.sock")
        const greeting = `${JSON.stringify({ QMP: { version: { qemu: { major: 7, minor: 2, micro: 0 } }, capabilities: [] } })}\n`
        const server = createServer((s) => {
          s.write(greeting)
          // Answers capability negotiation, then nothing.
          s.once("data", (d) => {
            const id = (JSON.parse(d.toString().split("\n")[0] ?? "{}") as { id?: number }).id
            s.write(`${JSON.stringify({ return: {}, id })}\n`)
          })
        })
        yield* Effect.acquireRelease(
          Effect.callback<void>((resume) => void server.listen(socket, () => resume(Effect.void))),
          () => Effect.sync(() => void server.close()),
        )
        const client = yield* Qmp.connect(socket, { timeoutMs: 2000 })
        const e = yield* client.execute("query-status", undefined, 200).pipe(Effect.flip)
        assert.strictEqual(e._tag, "QmpTimeout")
        if (e._tag === "QmpTimeout") assert.strictEqual(e.command, "query-status")
      }),
    ))

  it.live("no socket is a QmpClosed naming the path", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const e = yield* Qmp.connect("/nonexistent/engram.sock", { timeoutMs: 1000 }).pipe(Effect.flip)
        assert.strictEqual(e._tag, "QmpClosed")
        assert.strictEqual(e.socket, "/nonexistent/engram.sock")
      }),
    ))
})
