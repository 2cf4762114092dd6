// What this backend adds: a journal of the changes that succeeded, and none of the reads or refusals.
import { Store } from "@engram/store"
import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import { JournalStore } from "../src/index.js"
import { Harness } from "@engram/store-conformance"

describe("the journal", () => {
  it("records each change that succeeded, in order, and no read or refusal", async () => {
    const s = JournalStore.make()
    await Effect.runPromise(
      Effect.gen(function* () {
        const store = yield* Store
        yield* store.registerHost({ id: "h1" })
        yield* store.reportHost("h1", { totalMib: 4096, allocatableMib: 4096, totalVcpus: 4 })
        yield* Harness.hostsNow(store)
        yield* store.createSession({ id: "s1", budget: { memMib: 1024, vcpus: 1 } })
        yield* Effect.result(store.createSession({ id: "s1", budget: { memMib: 2048, vcpus: 1 } }))
      }).pipe(Effect.provideService(Store, s.store)),
    )
    expect(s.journal.map((e) => e.op)).toEqual(["registerHost", "reportHost", "createSession"])
  })
})
