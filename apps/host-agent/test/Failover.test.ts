/**
 * The agent's coordinator client with several replicas, over real HTTP: a replica that accepts
 * connections but never answers (hung) and one that refuses them are left for the next, once
 * however many calls fail on it together; the API's own answers (409, 401, its 503 `DiskFull`)
 * keep the client where it is; its 503 `Unavailable` and a proxy's 502/503 move it on.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { setTimeout as delay } from "node:timers/promises"
import { startCoordinator, type RunningCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { freePort } from "@engram/test-pg"
import { Clock, Effect, Fiber, Random, Redacted } from "effect"
import { FetchHttpClient } from "effect/http"
import { TestClock } from "effect/testing"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { makeHttp, pausedThrough } from "../src/Coordinator.js"
import * as Failover from "../src/Failover.js"
import { adminCall } from "./support/Admin.js"
import { capture as captureLogs } from "./support/Logs.js"

const adminToken = "failover-admin-token-0123456789"
/**
 * The bound of a try in the cases with a hung replica, which run on a TestClock: it passes when
 * the test moves the clock past it, never because the machine is slow (a try on the live
 * replica is never cut by it). Small, as the paused case's message states it.
 */
const callTimeoutMs = 1000
/** The bound of a try on the real clock, where no replica hangs: far beyond any answer of a loaded machine. */
const answerBoundMs = 30_000

/** Until `done`, in real time (the HTTP calls) while the TestClock stands still: up to 3000 turns of 10 ms or more. */
const until = (done: () => boolean) =>
  Effect.gen(function* () {
    for (let i = 0; i < 3000 && !done(); i++) yield* Effect.promise(() => delay(10))
  })

/**
 * `program` on a TestClock that moves only by the test's `TestClock.adjust`. A call that never
 * comes back is a failure after a generous real bound rather than a test hanging to its timeout.
 */
const onTestClock = <A, E>(program: Effect.Effect<A, E>): Effect.Effect<A, E> =>
  program.pipe(
    Effect.raceFirst(Effect.andThen(Effect.promise((signal) => delay(60_000, undefined, { signal })), Effect.die(new Error("no outcome within 60 s of real time")))),
    Effect.provide(TestClock.layer()),
  )

/**
 * `call` on the TestClock, past a hung replica: once `hung` has its `n`-th request (each try's
 * bound started before it was sent), the clock moves by `boundMs` and the call goes on to the next.
 */
const pastHung = <A, E>(call: Effect.Effect<A, E>, hung: Fake, boundMs = callTimeoutMs, n = 1) =>
  onTestClock(
    Effect.gen(function* () {
      const fiber = yield* Effect.forkChild(call, { startImmediately: true })
      yield* until(() => hung.requests() >= n)
      yield* TestClock.adjust(boundMs)
      return yield* Fiber.join(fiber)
    }),
  )

/** A server that counts the requests it gets and answers them with `answer` (never, for a hung replica). */
interface Fake {
  readonly url: string
  readonly requests: () => number
  readonly close: () => Promise<void>
}
const fake = async (answer: ((req: IncomingMessage, res: ServerResponse) => void) | "hang"): Promise<Fake> => {
  let n = 0
  const server: Server = createServer((req, res) => {
    n++
    if (answer !== "hang") answer(req, res)
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests: () => n,
    close: () => {
      server.closeAllConnections()
      return new Promise((resolve) => server.close(() => resolve()))
    },
  }
}
/**
 * A URL nothing listens on: connections are refused. The port is `freePort`'s, below the
 * kernel's ephemeral range (a port from `listen(0)`, closed, could be handed to another test's
 * server meanwhile, which would then answer).
 */
const refusingUrl = async () => `http://127.0.0.1:${await freePort()}`

let coordinator: RunningCoordinator
let hostToken = ""
const fakes: Fake[] = []
const admin = adminCall(() => coordinator.url, adminToken)

/** The client over `urls`, and the warnings it logs. */
const clientOver = async (urls: readonly string[], token = hostToken, boundMs = callTimeoutMs) => {
  const { layer: capture, lines: warnings } = captureLogs("Warn")
  const client = await Effect.runPromise(makeHttp({ url: urls, hostId: "a", hostToken: Redacted.make(token), callTimeoutMs: boundMs }).pipe(Effect.provide(FetchHttpClient.layer)))
  const run = <A, E>(eff: Effect.Effect<A, E>) => Effect.runPromise(Effect.result(eff).pipe(Effect.provide(capture)))
  return { client, run, warnings }
}
const track = async (f: Promise<Fake>) => {
  const made = await f
  fakes.push(made)
  return made
}

beforeAll(async () => {
  coordinator = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
  hostToken = (await admin("POST", "/v1/hosts", { id: "a" })).body["token"] as string
})
afterAll(async () => {
  await Promise.all(fakes.map((f) => f.close()))
  await coordinator?.stop()
})

describe("a hung or refusing replica is left for the next (Failover)", () => {
  it("calls land on the live replica after a hung one and a refusing one; the client then stays there", async () => {
    const hung = await track(fake("hang"))
    const { client, run, warnings } = await clientOver([hung.url, await refusingUrl(), coordinator.url])
    expect((await run(pastHung(client.heartbeat, hung)))._tag).toBe("Success")
    expect(hung.requests()).toBe(1)
    // Two switches, each named with both URLs; the host token is in no log line.
    expect(warnings.map((w) => [w.fields["from"], w.fields["op"]])).toEqual([
      [hung.url, "heartbeat"],
      [expect.stringMatching(/^http:\/\/127\.0\.0\.1:\d+$/), "heartbeat"],
    ])
    expect(warnings[1]?.fields["to"]).toBe(coordinator.url)
    expect(JSON.stringify(warnings)).not.toContain(hostToken)
    // Sticky: the next calls go to the live replica only (on the TestClock: its 1 s bound never passes).
    expect((await run(onTestClock(client.report({ totalMib: 8192, allocatableMib: 5120, totalVcpus: 4 }))))._tag).toBe("Success")
    expect((await run(onTestClock(client.assignments({ waitMs: 0, since: undefined }))))._tag).toBe("Success")
    expect(hung.requests()).toBe(1)
    expect(warnings).toHaveLength(2)
  })

  it("a long-poll on a hung replica is bounded by its wait plus a call's bound, then answered by the next", async () => {
    const hung = await track(fake("hang"))
    const { client, run } = await clientOver([hung.url, coordinator.url])
    // Past the poll's bound on the hung replica, and the spread (within 1 s) before it is sent on.
    const polled = await run(pastHung(client.assignments({ waitMs: 500, since: undefined }), hung, Failover.pollTimeoutMs(500, callTimeoutMs, 2) + 1000))
    expect(polled._tag).toBe("Success")
    expect(hung.requests()).toBe(1)
  })

  it("a long-poll open on a hung replica follows the client when another call moves it: answered by the next before its own bound, said in one info line", async () => {
    const hung = await track(fake("hang"))
    const { client } = await clientOver([hung.url, coordinator.url])
    const { layer: capture, lines: infos } = captureLogs("Info")
    const waitMs = 20_000
    const boundMs = Failover.pollTimeoutMs(waitMs, callTimeoutMs, 2)
    const outcome = await Effect.runPromise(
      Effect.gen(function* () {
        const startMs = yield* Clock.currentTimeMillis
        let polled: { readonly _tag: string } | undefined
        // A version other than the replica's: a live one answers at once (as when the host's sessions changed).
        yield* Effect.forkChild(
          client.assignments({ waitMs, since: "an-older-version" }).pipe(
            Effect.result,
            Effect.tap((r) => Effect.sync(() => (polled = r))),
          ),
          { startImmediately: true },
        )
        yield* until(() => hung.requests() === 1)
        const beat = yield* Effect.forkChild(Effect.result(client.heartbeat), { startImmediately: true })
        yield* until(() => hung.requests() === 2)
        // The heartbeat's bound passes, not the poll's (35 s): the heartbeat moves the client on.
        yield* TestClock.adjust(callTimeoutMs)
        const beaten = yield* Fiber.join(beat)
        // The moved poll is sent after a spread drawn within 1 s (`Pacing.moveSpreadMs`): not
        // before the TestClock moves (real time passes meanwhile, as for the calls above). The
        // real wait only gives a poll sent too early the time to be answered: however slow the
        // machine, a client that waits out the spread is never answered before the clock moves.
        yield* Effect.promise(() => delay(300))
        const beforeSpread = polled
        yield* TestClock.adjust(1000)
        yield* until(() => polled !== undefined)
        return { beaten: beaten._tag, beforeSpread: beforeSpread?._tag, polled: polled?._tag, elapsedMs: (yield* Clock.currentTimeMillis) - startMs }
        // Seeded: the spread drawn is the same every run (a draw rounded to 0 ms, one in 2000, would send the poll at once).
      }).pipe(Random.withSeed("failover-spread"), Effect.provide(TestClock.layer()), Effect.provide(capture)),
    )
    expect(outcome).toEqual({ beaten: "Success", beforeSpread: undefined, polled: "Success", elapsedMs: callTimeoutMs + 1000 })
    expect(outcome.elapsedMs).toBeLessThan(boundMs)
    // Each call reached the hung replica once: the poll was not sent there again.
    expect(hung.requests()).toBe(2)
    expect(infos.map((i) => [i.message, i.fields["from"], i.fields["to"]])).toEqual([[`assignments poll moved to ${coordinator.url}`, hung.url, coordinator.url]])
  })

  it("calls failing together on a hung replica switch once: none skips over the next replica", async () => {
    const hung = await track(fake("hang"))
    // The replica after the next: it must see no call (a switch per failure would reach it).
    const third = await track(fake((_req, res) => res.writeHead(500, { "content-type": "text/plain" }).end("third replica")))
    const { client, run, warnings } = await clientOver([hung.url, coordinator.url, third.url])
    // The twelve tries on the hung replica time out together (one move of the TestClock, once all
    // twelve are there); on the answering replica their bound never passes, however loaded the
    // machine (on the real clock, a CI at load once took longer than 1 s there, and even 5 s is a guess).
    const together = Effect.all(Array.from({ length: 12 }, () => Effect.result(client.heartbeat)), { concurrency: "unbounded" })
    const all = await run(pastHung(together, hung, callTimeoutMs, 12))
    const results = all._tag === "Success" ? all.success : []
    expect(results.map((r) => r._tag)).toEqual(Array.from({ length: 12 }, () => "Success"))
    expect(hung.requests()).toBe(12)
    expect(third.requests()).toBe(0)
    expect(warnings.map((w) => [w.fields["from"], w.fields["to"]])).toEqual([[hung.url, coordinator.url]])
  })

  it("a call timed out because the agent itself was paused (its clock jumped far past the bound) says so, not that the replica hung", async () => {
    const hung = await track(fake("hang"))
    const { client, run, warnings } = await clientOver([hung.url, coordinator.url])
    // The agent's wall clock jumps 60 s while the call waits on the hung replica (a SIGSTOP of
    // the agent, then SIGCONT: its timer fires once it runs again, the clock far past the bound).
    // On the TestClock: the hung try's bound passes only once the jump is made (on the real clock a
    // loaded machine could fire it before), and the try on the next replica is never cut.
    let jumpMs = 0
    const beat = await run(
      onTestClock(Effect.gen(function* () {
        const real = yield* Clock.Clock
        const nanos = () => real.currentTimeNanosUnsafe() + BigInt(jumpMs) * 1_000_000n
        const jumping: Clock.Clock = {
          currentTimeMillisUnsafe: () => real.currentTimeMillisUnsafe() + jumpMs,
          currentTimeMillis: Effect.sync(() => real.currentTimeMillisUnsafe() + jumpMs),
          currentTimeNanosUnsafe: nanos,
          currentTimeNanos: Effect.sync(nanos),
          monotonicTimeNanosUnsafe: () => real.monotonicTimeNanosUnsafe(),
          monotonicTimeNanos: Effect.sync(() => real.monotonicTimeNanosUnsafe()),
          sleep: (d) => real.sleep(d),
        }
        const call = yield* Effect.forkChild(client.heartbeat.pipe(Effect.provideService(Clock.Clock, jumping)), { startImmediately: true })
        yield* until(() => hung.requests() > 0)
        expect(hung.requests()).toBe(1)
        jumpMs = 60_000
        yield* TestClock.adjust(callTimeoutMs)
        return yield* Fiber.join(call)
      })),
    )
    expect(beat._tag).toBe("Success")
    expect(warnings.map((w) => [w.message.replace(/moved \d+ ms/, "moved N ms"), w.fields["from"], w.fields["to"]])).toEqual([
      [
        `a coordinator call timed out because this agent was paused: the clock moved N ms for a bound of ${callTimeoutMs} ms (the process or its host was frozen or starved), not because the replica hung; the agent moves to the next all the same`,
        hung.url,
        coordinator.url,
      ],
    ])
    expect(warnings[0]?.fields["tookMs"]).toBeGreaterThanOrEqual(61_000)
  })

  it("a replica's own time-out is not a pause: a bound overrun by less than itself (and 1 s) is the replica's", () => {
    expect(pausedThrough(1_050, 1_000)).toBe(false)
    expect(pausedThrough(1_999, 1_000)).toBe(false)
    expect(pausedThrough(2_000, 1_000)).toBe(true)
    expect(pausedThrough(45_000, 30_000)).toBe(false)
    expect(pausedThrough(300_000, 30_000)).toBe(true)
  })

  it("every replica unreachable: the call fails after trying each once, and the client has gone round to the first", async () => {
    const hung = await track(fake("hang"))
    const refusing = await refusingUrl()
    const { client, run, warnings } = await clientOver([refusing, hung.url])
    const failed = await run(pastHung(client.heartbeat, hung))
    expect(failed._tag === "Failure" && failed.failure).toMatchObject({ _tag: "CoordinatorError", op: "heartbeat", status: null, message: "timed out" })
    expect(hung.requests()).toBe(1)
    expect(warnings.map((w) => [w.fields["from"], w.fields["to"]])).toEqual([
      [refusing, hung.url],
      [hung.url, refusing],
    ])
  })
})

describe("the coordinator's answers keep the client where it is; a proxy's gateway error does not", () => {
  it("a 409 (Conflict) and a 401 are answers: the next replica sees no call", async () => {
    const next = await track(fake((_req, res) => res.writeHead(500).end()))
    const { client, run, warnings } = await clientOver([coordinator.url, next.url], hostToken, answerBoundMs)
    expect((await admin("PUT", "/v1/hosts/a/report", { totalMib: 8192, allocatableMib: 5120, totalVcpus: 4 })).status).toBe(200)
    expect((await admin("POST", "/v1/sessions", { id: "s1", memMib: 256, vcpus: 1, affinity: ["a"] })).status).toBe(201)
    expect((await run(client.started("s1")))._tag).toBe("Success")
    const again = await run(client.started("s1"))
    expect(again._tag === "Failure" && again.failure).toMatchObject({ _tag: "Conflict", op: "started" })
    const stranger = await clientOver([coordinator.url, next.url], "not-a-token-of-anyone-0123456789", answerBoundMs)
    const refused = await stranger.run(stranger.client.heartbeat)
    expect(refused._tag === "Failure" && refused.failure).toMatchObject({ _tag: "CoordinatorError", status: 401 })
    expect(next.requests()).toBe(0)
    expect([...warnings, ...stranger.warnings]).toEqual([])
  })

  it("the API's 503 Unavailable (this replica cannot reach the store, or it is shutting down) moves it on; its other 503s are answers; a proxy's HTML 502 or 503 moves it on", async () => {
    const answering = (error: string) =>
      track(
        fake((_req, res) =>
          res.writeHead(503, { "content-type": "application/json", "retry-after": "2" }).end(JSON.stringify({ error, message: `${error} (test)`, retryAfterMs: 1500 })),
        ),
      )
    // Cut off from the store: the next replica answers, and the client stays there.
    const storeAway = await answering("Unavailable")
    const away = await clientOver([storeAway.url, coordinator.url], hostToken, answerBoundMs)
    expect((await away.run(away.client.heartbeat))._tag).toBe("Success")
    expect((await away.run(away.client.heartbeat))._tag).toBe("Success")
    expect(storeAway.requests()).toBe(1)
    expect(away.warnings.map((w) => [w.fields["from"], w.fields["to"]])).toEqual([[storeAway.url, coordinator.url]])
    // Its connections on a database that only reads (a standby after a failover): another
    // replica may have reached the new primary, the client moves there.
    const standby = await answering("ReadOnly")
    const promoted = await clientOver([standby.url, coordinator.url], hostToken, answerBoundMs)
    expect((await promoted.run(promoted.client.heartbeat))._tag).toBe("Success")
    expect(standby.requests()).toBe(1)
    expect(promoted.warnings.map((w) => [w.fields["from"], w.fields["to"]])).toEqual([[standby.url, coordinator.url]])
    // Every replica without the store: one try on each, then the coordinator's answer and its wait.
    const alsoAway = await answering("Unavailable")
    const allAway = await clientOver([storeAway.url, alsoAway.url], hostToken, answerBoundMs)
    const failed = await allAway.run(allAway.client.heartbeat)
    expect(failed._tag === "Failure" && failed.failure).toMatchObject({ _tag: "CoordinatorError", status: 503, retryAfterMs: 1500 })
    expect([storeAway.requests(), alsoAway.requests()]).toEqual([2, 1])
    // A full disk is the database's, the same on every replica: an answer, the client stays.
    const diskFull = await answering("DiskFull")
    const full = await clientOver([diskFull.url, coordinator.url], hostToken, answerBoundMs)
    const answered = await full.run(full.client.heartbeat)
    expect(answered._tag === "Failure" && answered.failure).toMatchObject({ _tag: "CoordinatorError", status: 503, retryAfterMs: 1500 })
    expect((await full.run(full.client.heartbeat))._tag).toBe("Failure")
    expect(diskFull.requests()).toBe(2)
    expect(full.warnings).toEqual([])
    for (const status of [502, 503]) {
      const gateway = await track(fake((_req, res) => res.writeHead(status, { "content-type": "text/html" }).end("<h1>upstream away</h1>")))
      const proxied = await clientOver([gateway.url, coordinator.url], hostToken, answerBoundMs)
      expect((await proxied.run(proxied.client.heartbeat))._tag).toBe("Success")
      expect(gateway.requests()).toBe(1)
      expect(proxied.warnings.map((w) => w.fields["to"])).toEqual([coordinator.url])
    }
  })
})

describe("the bounds of a call", () => {
  it("with several URLs an ordinary call is bounded by the heartbeat interval, within [1 s, 30 s], with one by 30 s as before; a long-poll by its wait plus that, at least 15 s", () => {
    expect(Failover.callTimeoutMs(20_000)).toBe(20_000)
    expect(Failover.callTimeoutMs(40_000)).toBe(30_000)
    expect(Failover.callTimeoutMs(100)).toBe(1_000)
    expect([Failover.callTimeoutFor(2, 4_000), Failover.callTimeoutFor(1, 4_000), Failover.callTimeoutFor(3, 100_000)]).toEqual([4_000, 30_000, 30_000])
    expect(Failover.pollTimeoutMs(20_000, 20_000)).toBe(40_000)
    expect(Failover.pollTimeoutMs(20_000, 4_000)).toBe(35_000)
    // One URL: the 15 s margin before replicas.
    expect(Failover.pollTimeoutMs(20_000, 30_000, 1)).toBe(35_000)
  })

  it("the bound follows the agent's heartbeat interval as it learns it (`followHeartbeat`): the same rule as at start, never above the start's", async () => {
    const bounds = async (urls: readonly string[], intervals: readonly number[]) => {
      const client = await Effect.runPromise(makeHttp({ url: urls, hostId: "a", hostToken: Redacted.make(hostToken), callTimeoutMs: 30_000 }).pipe(Effect.provide(FetchHttpClient.layer)))
      return Effect.runPromise(Effect.forEach(intervals, (ms) => client.followHeartbeat!(ms)))
    }
    expect(await bounds([coordinator.url, await refusingUrl()], [5_000, 100, 100_000, 40_000])).toEqual([5_000, 1_000, 30_000, 30_000])
    // One URL: nowhere else to go, the 30 s bound stays.
    expect(await bounds([coordinator.url], [5_000])).toEqual([30_000])
  })

  it("a fleet given one list spreads over the replicas: each agent starts on one drawn from its host id, the same every start", () => {
    const counts = [0, 0, 0]
    for (let i = 0; i < 3000; i++) counts[Failover.startIndex(`host-${i}`, 3)]!++
    for (const c of counts) expect(c).toBeGreaterThan(800)
    expect(Failover.startIndex("host-7", 3)).toBe(Failover.startIndex("host-7", 3))
    expect(Failover.startIndex("host-7", 1)).toBe(0)
  })
})
