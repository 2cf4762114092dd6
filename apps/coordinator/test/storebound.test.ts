// A bounded store call never outlives its caller: however early the caller is interrupted, even
// while the call it forked is still taking its first step, the call is interrupted too.
import { Effect, Exit } from "effect"
import type { Fiber } from "effect"
import { describe, expect, it } from "vitest"
import { StoreSim } from "@engram/store-sim"
import { Store, Unavailable } from "@engram/store"
import { boundStore, bounded, readOnlyHoldMs } from "../src/StoreBound.js"

/** Polls `done` on the event loop, bounded by 10 s or more. */
const until = async (done: () => boolean): Promise<boolean> => {
  for (let k = 0; k < 1000 && !done(); k++) await new Promise((r) => setTimeout(r, 10))
  return done()
}

describe("bounded", () => {
  it("a caller interrupted while its call takes its first step interrupts the call", async () => {
    let caller: Fiber.Fiber<unknown, unknown> | undefined
    let callInterrupted = false
    // The call's first step interrupts its caller, then the call waits forever (a database away).
    const call = Effect.suspend(() => {
      caller?.interruptUnsafe()
      return Effect.never
    }).pipe(
      Effect.onInterrupt(() =>
        Effect.sync(() => {
          callInterrupted = true
        }),
      ),
    )
    const exit = await Effect.runPromiseExit(
      Effect.withFiber((fiber) => {
        caller = fiber
        return bounded(call, 600_000, "test")
      }),
    )
    expect(Exit.hasInterrupts(exit)).toBe(true)
    expect(await until(() => callInterrupted)).toBe(true)
  })

  it("answers the call's own answer, and times out a call that does not answer", async () => {
    expect(await Effect.runPromise(bounded(Effect.succeed(7), 600_000, "now"))).toBe(7)
    expect(await Effect.runPromise(bounded(Effect.as(Effect.sleep(5), 8), 600_000, "later"))).toBe(8)
    let callInterrupted = false
    const slow = Effect.never.pipe(
      Effect.onInterrupt(() =>
        Effect.sync(() => {
          callInterrupted = true
        }),
      ),
    )
    const exit = await Effect.runPromiseExit(bounded(slow, 50, "slow"))
    expect(Exit.isFailure(exit) && String(exit.cause)).toContain("did not answer slow within 50 ms")
    expect(await until(() => callInterrupted)).toBe(true)
  })

  it("a call the server cancelled for its statement_timeout (57014) fails in the same words as our own bound, and the stalls are told", async () => {
    const told: string[] = []
    const stalls = { slow: () => undefined, timedOut: (name: string) => Effect.sync(() => void told.push(name)), diagnose: Effect.succeed(null), diagnoseSince: () => Effect.succeed(null) }
    const exit = await Effect.runPromiseExit(
      Effect.gen(function* () {
        const sim = yield* Store
        const cancelled = { ...sim, getHost: () => Effect.fail(new Unavailable({ reason: "57014: canceling statement due to statement timeout", retryAfterMs: 1000, kind: "timed_out" })) }
        const { store } = boundStore(cancelled, 15_000, undefined, stalls)
        return yield* store.getHost("h1")
      }).pipe(Effect.provide(StoreSim.layer())),
    )
    // A read: the caller is told nothing changed, not that a write's outcome is unknown.
    expect(Exit.isFailure(exit) && String(exit.cause)).toContain("the database did not answer getHost within 15000 ms (ENGRAM_STORE_TIMEOUT_MS); a read: nothing was changed")
    expect(Exit.isFailure(exit) && String(exit.cause)).not.toContain("57014")
    expect(told).toEqual(["getHost"])
  })

  it("a write past its bound says its outcome is unknown until read back; a read says it changed nothing", async () => {
    const cancel = () => Effect.fail(new Unavailable({ reason: "57014: canceling statement due to statement timeout", retryAfterMs: 1000, kind: "timed_out" }))
    const [write, read] = await Effect.runPromise(
      Effect.gen(function* () {
        const sim = yield* Store
        const { store } = boundStore({ ...sim, registerHost: cancel, listSessions: cancel }, 15_000)
        return yield* Effect.all([Effect.flip(store.registerHost({ id: "h9" })), Effect.flip(store.listSessions())])
      }).pipe(Effect.provide(StoreSim.layer())),
    )
    expect(write.message).toBe("store unavailable: the database did not answer registerHost within 15000 ms (ENGRAM_STORE_TIMEOUT_MS); a write's outcome is unknown until read back")
    expect(read.message).toBe("store unavailable: the database did not answer listSessions within 15000 ms (ENGRAM_STORE_TIMEOUT_MS); a read: nothing was changed")
  })
})

describe("the store's health: writes refused", () => {
  /** A store whose writes (`registerHost`) fail with `Unavailable` of `kind` while `failing` is set, and succeed after. */
  const storeRefusing = (kind: "disk_full" | "read_only") =>
    Effect.gen(function* () {
      const sim = yield* Effect.service(Store).pipe(Effect.provide(StoreSim.layer()))
      const state = { failing: true }
      const store = {
        ...sim,
        registerHost: (...args: Parameters<typeof sim.registerHost>) =>
          state.failing ? Effect.fail(new Unavailable({ reason: `refused (${kind})`, retryAfterMs: 1000, kind })) : sim.registerHost(...args),
      }
      return { ...boundStore(store, 60_000), state }
    })

  it("a database that only reads keeps the store not ready for readOnlyHoldMs without another refusal (no write comes to a replica taken out of rotation); a full disk until a write succeeds", async () => {
    const t0 = Date.now()
    for (const kind of ["read_only", "disk_full"] as const) {
      const { store, health, state } = await Effect.runPromise(storeRefusing(kind))
      expect(health.writesRefused(t0)).toBeNull()
      const refused = await Effect.runPromiseExit(store.registerHost({ id: `h-${kind}` }))
      expect(Exit.isFailure(refused)).toBe(true)
      const at = health.writesRefused(Date.now())
      expect(at).toMatchObject({ kind, message: `store unavailable: refused (${kind})` })
      const later = at!.atMs + readOnlyHoldMs
      expect(health.writesRefused(later - 1)).toMatchObject({ kind })
      if (kind === "read_only") expect(health.writesRefused(later)).toBeNull()
      else expect(health.writesRefused(later + 3_600_000)).toMatchObject({ kind })
      // A write that succeeds clears either.
      state.failing = false
      expect(Exit.isSuccess(await Effect.runPromiseExit(store.registerHost({ id: `h2-${kind}` })))).toBe(true)
      expect(health.writesRefused(at!.atMs)).toBeNull()
    }
  })
})
