// A coordinator on the in-memory store (no reaper) that one test file shares: started before its
// tests, stopped after them.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { afterAll, beforeAll } from "vitest"

/** Registers the file's coordinator with `adminToken`; its `url` is read inside the file's tests. */
export const simCoordinatorForFile = (adminToken: string): { readonly url: string } => {
  let c: RunningCoordinator | undefined
  beforeAll(async () => {
    c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
  })
  afterAll(() => c?.stop())
  return {
    get url() {
      if (c === undefined) throw new Error("the file's coordinator is read before it started")
      return c.url
    },
  }
}
