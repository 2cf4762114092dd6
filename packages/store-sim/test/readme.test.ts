import { Store } from "@engram/store"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { StoreSim } from "../src/index.js"

describe("the README example", () => {
  it("places a session on a measured host", async () => {
    const placed = await Effect.runPromise(
      Effect.gen(function* () {
        const store = yield* Store
        yield* store.registerHost({ id: "h1" })
        yield* store.reportHost("h1", { totalMib: 17_408, allocatableMib: 17_408, totalVcpus: 8 })
        return yield* store.createSession({ id: "s1", budget: { memMib: 4096, vcpus: 2 } })
      }).pipe(Effect.provide(StoreSim.layer())),
    )
    expect(placed._tag).toBe("Placed")
    expect(placed.session.hostId).toBe("h1")
  })

  it("noFitDetails: false leaves the details out of a queued answer", async () => {
    const queued = await Effect.runPromise(
      Effect.gen(function* () {
        const store = yield* Store
        yield* store.registerHost({ id: "h1" })
        yield* store.reportHost("h1", { totalMib: 2048, allocatableMib: 2048, totalVcpus: 8 })
        return yield* store.createSession({ id: "s1", budget: { memMib: 4096, vcpus: 2 } })
      }).pipe(Effect.provide(StoreSim.layer({ noFitDetails: false }))),
    )
    expect(queued._tag === "Queued" && queued.noFit).toEqual([])
  })
})
