// A write whose client leaves while the store works on it is still announced. The store here
// commits a create whether or not its caller stays (as a grouped create on PostgreSQL does: the
// batch's fiber commits it), and the client gives up mid-write, as one in front of a frozen
// replica does: the host's agent, long-polling its assignments, must still be told of the
// session placed on it (it was not: the notice was sent by the request, after the write, and the
// request was cut off; the agent never started the session). Real HTTP, a real coordinator.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { Store } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Deferred, Effect, Layer } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client } from "./support/http.js"

const adminToken = "notices-admin-token-0123456789abcdef"

/** The gate every create waits at, and what the creates went through. */
const gate = Deferred.makeUnsafe<void>()
const seen = { entered: 0, cut: 0 }

// Creates wait at the gate; one whose caller is interrupted there still commits once the gate
// opens (in a fiber of its own), as a statement already sent to the database does.
const gated = Layer.effect(
  Store,
  Effect.map(Store, (store) =>
    Store.of({
      ...store,
      createSession: (input) =>
        Effect.suspend(() => {
          seen.entered++
          return Deferred.await(gate)
        }).pipe(
          Effect.onInterrupt(() =>
            Effect.sync(() => {
              seen.cut++
              Effect.runFork(Deferred.await(gate).pipe(Effect.andThen(store.createSession(input))))
            }),
          ),
          Effect.andThen(store.createSession(input)),
        ),
    }),
  ),
).pipe(Layer.provide(StoreSim.layer()))

let c: RunningCoordinator
beforeAll(async () => {
  c = await startCoordinator({ store: gated, reaper: false, logLevel: "None", config: { port: 0, adminToken } })
})
afterAll(() => c?.stop())

/** Until `done()` holds, or `ms` of real time passed (the old code's cut shows at once; the new one's never comes). */
const until = async (done: () => boolean, ms: number) => {
  for (const end = Date.now() + ms; !done() && Date.now() < end; ) await new Promise((ok) => setTimeout(ok, 10))
}

describe("a write's notices when its client leaves", () => {
  it("a create whose client gave up mid-write still wakes its host's agent, which is told of the session", async () => {
    const admin = client(c.url, adminToken)
    const added = await admin.post("/v1/hosts", { id: "n1" })
    expect(added.status).toBe(201)
    const agent = client(c.url, added.body.token as string)
    expect((await agent.put("/v1/hosts/n1/report", { totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 })).status).toBe(200)
    const first = await agent.get("/v1/hosts/n1/assignments?waitMs=0")
    expect(first.status).toBe(200)
    // The agent's long-poll, open before the create (its deadline is far past what the wake takes).
    const poll = agent.get(`/v1/hosts/n1/assignments?waitMs=25000&since=${encodeURIComponent(first.body.version as string)}`)

    const leaving = new AbortController()
    const create = fetch(`${c.url}/v1/sessions`, {
      method: "POST",
      headers: { authorization: `Bearer ${adminToken}`, "content-type": "application/json" },
      body: JSON.stringify({ id: "gone-client", memMib: 512, vcpus: 1, affinity: ["n1"] }),
      signal: leaving.signal,
    }).catch((e: unknown) => e)
    await until(() => seen.entered === 1, 20_000)
    expect(seen.entered).toBe(1)
    leaving.abort()
    expect(await create).toMatchObject({ name: "AbortError" })
    // The old code cut the request (and so the create's call) when the client left: wait for
    // that, briefly; the new one lets the write finish, so there is nothing to wait for.
    await until(() => seen.cut > 0, 1_000)
    Deferred.doneUnsafe(gate, Effect.void)

    const woken = await poll
    expect(woken.status).toBe(200)
    expect((woken.body.sessions as { id: string }[]).map((s) => s.id)).toContain("gone-client")
    expect(seen.cut).toBe(0)
  }, 60_000)
})
