// A call repeated on the next replica after a write that committed (the first replica's store
// call timed out after its commit and answered 503 `Unavailable`; the same happens when a replica
// freezes after its commit) must not turn done work into a failure that says otherwise: a 409
// "already registered" for a host this call registered (its token lost with the first answer),
// a 409 for an idle or resume that happened, a 404 for a release or a removal that happened. A
// call that a repeat would answer so is sent once (it moves on only from a replica that never
// received it) and fails with the first replica's answer, which says the outcome is unknown.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Store, Unavailable } from "@engram/store"
import type { StoreShape } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Effect, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { createClient, Errors } from "../src/index.js"
import { adminToken } from "./support/Fleet.js"

/** The store methods whose next call commits and then fails as a timed-out store call does. */
const failNext = new Set<keyof StoreShape>()
/** The store methods whose next call is refused by a database that only reads (nothing written). */
const refuseNext = new Set<keyof StoreShape>()
const committedThenUnavailable = Layer.effect(
  Store,
  Effect.gen(function* () {
    const s = yield* Store
    const wrapped = Object.fromEntries(
      Object.entries(s).map(([k, f]) => [
        k,
        typeof f !== "function" || k === "limits"
          ? f
          : (...args: unknown[]) =>
              refuseNext.delete(k as keyof StoreShape)
                ? Effect.fail(new Unavailable({ reason: "cannot execute INSERT in a read-only transaction", retryAfterMs: 100, kind: "read_only" }))
                : Effect.flatMap((f as (...a: unknown[]) => Effect.Effect<unknown, unknown>)(...args), (v) =>
                failNext.delete(k as keyof StoreShape)
                  ? Effect.fail(new Unavailable({ reason: "statement timeout (after its commit)", retryAfterMs: 100, kind: "timed_out" }))
                  : Effect.succeed(v),
              ),
      ]),
    )
    return Store.of(wrapped as unknown as StoreShape)
  }),
).pipe(Layer.provide(StoreSim.layer({ limits: { ...StoreSim.make().store.limits(), heartbeatStaleWindowMs: 24 * 60 * 60 * 1000 } })))

let c: RunningCoordinator
let engram: ReturnType<typeof createClient>
beforeAll(async () => {
  c = await startCoordinator({ store: committedThenUnavailable, reaper: false, logLevel: "None", config: { port: 0, adminToken } })
  const port = new URL(c.url).port
  // Two replicas of one store: the same coordinator under two names.
  engram = createClient({ baseUrl: [`http://127.0.0.1:${port}`, `http://localhost:${port}`], token: adminToken })
})
afterAll(() => c?.stop())

/** What a call answered: "ok", or the error's class name and status. */
const outcome = (p: Promise<unknown>): Promise<string> =>
  p.then(
    () => "ok",
    (e: unknown) => (e instanceof Errors.EngramError ? `${e.constructor.name} ${(e as { status?: number }).status ?? ""}`.trim() : String(e)),
  )

/** Runs `call` with `method`'s next store call committing and then answering 503; checks the outcome. */
const afterCommit = async (method: keyof StoreShape, call: () => Promise<unknown>): Promise<string> => {
  failNext.add(method)
  const got = await outcome(call())
  expect(failNext.has(method)).toBe(false)
  // Either done and said so, or the first replica's answer (outcome unknown): never a 409 or 404.
  expect(got === "ok" || got.startsWith("Unavailable"), `${method}: ${got}`).toBe(true)
  return got
}

const report = async (hostId: string, token: string) => {
  const r = await fetch(`${c.url}/v1/hosts/${hostId}/report`, {
    method: "PUT",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify({ totalMib: 65536, allocatableMib: 65536, totalVcpus: 16 }),
  })
  expect(r.status).toBe(200)
}

describe("a call whose first try committed and answered 503", () => {
  it("host registration, removal and token rotation", async () => {
    await afterCommit("registerHost", () => engram.hosts.create({ id: "h-reg" }))
    expect((await engram.hosts.get("h-reg")).id).toBe("h-reg")
    const rotated = await afterCommit("setHostTokenHash", () => engram.hosts.rotateToken("h-reg"))
    expect(rotated).toBe("ok")
    await afterCommit("removeHost", () => engram.hosts.remove("h-reg"))
    await expect(engram.hosts.get("h-reg")).rejects.toBeInstanceOf(Errors.NotFound)
  })

  it("cordon, uncordon and drain", async () => {
    await engram.hosts.create({ id: "h-cordon" })
    for (const [call, state] of [
      [() => engram.hosts.cordon("h-cordon"), "cordoned"],
      [() => engram.hosts.uncordon("h-cordon"), "ready"],
      [() => engram.hosts.drain("h-cordon"), "draining"],
    ] as const) {
      await afterCommit("setHostState", call)
      expect((await engram.hosts.get("h-cordon")).state).toBe(state)
    }
  })

  it("a session's idle, resume, TTL and end", async () => {
    const { token } = await engram.hosts.create({ id: "h-s" })
    await report("h-s", token)
    await engram.sessions.create({ id: "s1", memMib: 1024, vcpus: 1 })
    const started = await fetch(`${c.url}/v1/sessions/s1/started`, { method: "POST", headers: { authorization: `Bearer ${token}` } })
    expect(started.status).toBe(200)
    await afterCommit("idle", () => engram.sessions.idle("s1"))
    expect((await engram.sessions.get("s1")).state).toBe("parked")
    await afterCommit("resume", () => engram.sessions.resume("s1"))
    expect((await engram.sessions.get("s1")).state).toBe("running")
    await afterCommit("setTtl", () => engram.sessions.setTtl("s1", 60_000))
    await afterCommit("endSession", () => engram.sessions.end("s1"))
    expect((await engram.sessions.get("s1")).state).toBe("ended")
  })

  it("a reservation's release", async () => {
    const { token } = await engram.hosts.create({ id: "h-r" })
    await report("h-r", token)
    await engram.reservations.reserve({ id: "r1", hostId: "h-r", ownerKind: "external", ownerId: "job", memMib: 512, vcpus: 0 })
    await afterCommit("release", () => engram.reservations.release("r1"))
    await expect(engram.reservations.get("r1")).rejects.toBeInstanceOf(Errors.NotFound)
  })
})

describe("a call refused by a replica whose database only reads (a standby after a failover)", () => {
  it("a call sent once still goes on to the next replica: nothing was written", async () => {
    refuseNext.add("registerHost")
    const created = await engram.hosts.create({ id: "h-standby" })
    expect(refuseNext.has("registerHost")).toBe(false)
    expect(created.id).toBe("h-standby")
    const { token } = await engram.hosts.rotateToken("h-standby")
    await report("h-standby", token)
    await engram.reservations.reserve({ id: "r-standby", hostId: "h-standby", ownerKind: "external", ownerId: "job", memMib: 512, vcpus: 0 })
    refuseNext.add("release")
    await engram.reservations.release("r-standby")
    expect(refuseNext.has("release")).toBe(false)
    await expect(engram.reservations.get("r-standby")).rejects.toBeInstanceOf(Errors.NotFound)
  })
})
