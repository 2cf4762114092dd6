// The coordinator's listen queue against the kernel's cap on it: a cap below the queue it asks
// for is named at start (the kernel lowers it silently, and connections past it are dropped).
import { describe, expect, it } from "vitest"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { listenBacklog, listenQueueWarning, readSomaxconn } from "../src/Coordinator.js"

describe("the listen queue's cap", () => {
  it("a cap below the coordinator's queue is named, with the sysctl that raises it", () => {
    const warning = listenQueueWarning(4096)
    expect(warning).toContain("at 4096 connections (net.core.somaxconn)")
    expect(warning).toContain(`below the ${listenBacklog}`)
    expect(warning).toContain(`sysctl -w net.core.somaxconn=${listenBacklog}`)
  })

  it("a cap at or above the queue, or one not known, gives no warning", () => {
    expect(listenQueueWarning(listenBacklog)).toBeUndefined()
    expect(listenQueueWarning(65_535)).toBeUndefined()
    expect(listenQueueWarning(undefined)).toBeUndefined()
  })

  it("the cap is read from the kernel's file; a missing or unreadable one is not known", () => {
    const dir = mkdtempSync(join(tmpdir(), "engram-somaxconn-"))
    try {
      writeFileSync(join(dir, "somaxconn"), "4096\n")
      writeFileSync(join(dir, "garbage"), "many\n")
      expect(readSomaxconn(join(dir, "somaxconn"))).toBe(4096)
      expect(readSomaxconn(join(dir, "garbage"))).toBeUndefined()
      expect(readSomaxconn(join(dir, "absent"))).toBeUndefined()
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
