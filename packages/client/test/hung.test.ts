// A replica that takes the connection and never answers (a frozen process, a stopped VM behind a
// live socket) holds no call forever: past `timeoutMs` (on the Effect Clock: a TestClock here,
// no sleeping) a call safe to repeat (a create too: it carries an id the client chose) moves on
// to the next replica; a move fails saying no answer came in time, and no other replica is asked.
import type { RunningCoordinator } from "@engram/coordinator"
import { Effect, Fiber } from "effect"
import { FetchHttpClient } from "effect/http"
import type { HttpClient } from "effect/http"
import { TestClock } from "effect/testing"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { make } from "../src/index.js"
import { adminToken, start } from "./support/Fleet.js"

let c: RunningCoordinator
beforeAll(async () => {
  c = await start()
})
afterAll(() => c?.stop())

/** A real HTTP server that reads every request and never answers it; its URL and how many it took. */
const hanging = async () => {
  let requests = 0
  const server = createServer(() => void requests++)
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests: () => requests,
    close: () => new Promise<void>((ok) => server.close(() => ok()).closeAllConnections()),
  }
}

/** Until the hung server has taken `n` requests (real I/O: polled on the real timer, not the test clock). */
const taken = (hung: { readonly requests: () => number }, n: number) =>
  Effect.promise(async () => {
    while (hung.requests() < n) await new Promise((ok) => setTimeout(ok, 5))
  })

const run = <A, E>(program: Effect.Effect<A, E, HttpClient.HttpClient | TestClock.TestClock>) =>
  Effect.runPromise(program.pipe(Effect.provide(FetchHttpClient.layer), Effect.provide(TestClock.layer())))

describe("a replica that hangs", () => {
  it("a read moves to the next replica after timeoutMs, and the client stays on the one that answered", async () => {
    const hung = await hanging()
    try {
      await run(
        Effect.gen(function* () {
          const hungs: string[] = []
          const client = yield* make({ baseUrl: [hung.url, c.url], token: adminToken, timeoutMs: 5_000, onHung: (url) => void hungs.push(url) })
          const read = yield* Effect.forkChild(client.fleet.snapshot())
          yield* taken(hung, 1)
          yield* TestClock.adjust(4_999)
          expect(read.pollUnsafe(), "still waiting for the hung replica").toBeUndefined()
          yield* TestClock.adjust(1)
          const fleet = yield* Fiber.join(read)
          expect(fleet).toMatchObject({ hosts: expect.any(Object) })
          // Told which replica hung (the CLI remembers it across commands).
          expect(hungs).toEqual([hung.url])
          yield* client.fleet.snapshot()
          expect(hung.requests()).toBe(1)
        }),
      )
    } finally {
      await hung.close()
    }
  })

  it("a create without an id carries one the client chose: after a hang it goes to the next replica and is stored once", async () => {
    const hung = await hanging()
    try {
      await run(
        Effect.gen(function* () {
          const client = yield* make({ baseUrl: [hung.url, c.url], token: adminToken, timeoutMs: 5_000 })
          const direct = yield* make({ baseUrl: c.url, token: adminToken })
          const before = (yield* direct.sessions.list({})).items.length
          const create = yield* Effect.forkChild(client.sessions.create({ memMib: 256, vcpus: 1 }))
          yield* taken(hung, 1)
          yield* TestClock.adjust(5_000)
          const placed = yield* Fiber.join(create)
          expect(placed.id).toMatch(/^[0-9a-f-]{36}$/)
          expect((yield* direct.sessions.get(placed.id)).id).toBe(placed.id)
          expect((yield* direct.sessions.list({})).items.length).toBe(before + 1)
        }),
      )
      expect(hung.requests()).toBe(1)
    } finally {
      await hung.close()
    }
  })

  it("a move is not repeated elsewhere: after a hang it fails as no answer in time, naming the replica", async () => {
    const hung = await hanging()
    try {
      const failed = await run(
        Effect.gen(function* () {
          const client = yield* make({ baseUrl: [hung.url, c.url], token: adminToken, timeoutMs: 5_000, moveHoldMs: 10_000 })
          const move = yield* Effect.forkChild(Effect.flip(client.sessions.move("some-session", { maxDowntimeMs: 500 })))
          yield* taken(hung, 1)
          yield* TestClock.adjust(14_999)
          expect(move.pollUnsafe(), "held for the move's hold and the timeout").toBeUndefined()
          yield* TestClock.adjust(1)
          return yield* Fiber.join(move)
        }),
      )
      expect(failed).toMatchObject({ _tag: "TransportError", url: hung.url, status: null })
      expect(failed.message).toBe(`cannot reach the coordinator at ${hung.url}: no answer within 15000 ms (it may have been done: look before trying again)`)
      expect(hung.requests()).toBe(1)
    } finally {
      await hung.close()
    }
  })

  it("a wait's hold is added to the timeout: a wait of 20 s is not cut at timeoutMs", async () => {
    const hung = await hanging()
    try {
      await run(
        Effect.gen(function* () {
          const client = yield* make({ baseUrl: hung.url, token: adminToken, timeoutMs: 5_000 })
          const wait = yield* Effect.forkChild(Effect.flip(client.sessions.wait("s", { state: "running", timeoutMs: 20_000 })))
          yield* taken(hung, 1)
          yield* TestClock.adjust(24_999)
          expect(wait.pollUnsafe(), "held for the wait and the timeout").toBeUndefined()
          yield* TestClock.adjust(1)
          expect(yield* Fiber.join(wait)).toMatchObject({ _tag: "TransportError", message: expect.stringContaining("no answer within 25000 ms") })
        }),
      )
    } finally {
      await hung.close()
    }
  })

  it("a timeoutMs that is not an integer > 0 is refused by name", async () => {
    const refused = await Effect.runPromiseExit(make({ baseUrl: c.url, token: adminToken, timeoutMs: 0 }).pipe(Effect.provide(FetchHttpClient.layer)))
    expect(String(refused)).toContain("timeoutMs 0: must be an integer > 0 (ms)")
  })
})
