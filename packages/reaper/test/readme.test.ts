// The README's example, as written there (the listener records instead of printing).
import { ParkPolicy } from "@engram/core"
import { StoreSim } from "@engram/store-sim"
import { Effect, Layer } from "effect"
import { describe, expect, it } from "vitest"
import { Reaper, ReaperEvents, ReaperState, Trigger } from "../src/index.js"

describe("the README example", () => {
  it("runs a pass and pokes the trigger", async () => {
    const told: string[] = []
    const state = ReaperState.make()
    const options = { policy: ParkPolicy.defaultName, state, leading: () => true }
    const program = Effect.gen(function* () {
      const report = yield* Reaper.pass(options)
      yield* (yield* Trigger).poke
      return report
    })
    const report = await Effect.runPromise(
      program.pipe(
        Effect.provide(Trigger.layer(options).pipe(Layer.provideMerge(StoreSim.layer()))),
        Effect.provide(ReaperEvents.layer((e) => void told.push(e._tag))),
        Effect.scoped,
      ),
    )
    expect(report).toMatchObject({ _tag: "Done", yields: [], placed: [] })
    expect(told).toEqual(["FleetRead", "Reclaimed", "Decided", "Drained"])
  })
})
