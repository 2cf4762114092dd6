import { closeSync, openSync, readSync } from "node:fs"
import { gunzipSync } from "node:zlib"
import { describe, expect, it } from "vitest"
import { Cpio, cmdline, initramfs, isStaticElf, parseTick, readyLine, ticks } from "../src/index.js"

describe("the newc writer", () => {
  it("writes entries the reader gets back, 4-byte aligned, with the trailer", () => {
    const archive = Cpio.newc([
      { kind: "dir", path: "bin" },
      { kind: "file", path: "bin/x", data: Buffer.from("hello"), mode: 0o755 },
      { kind: "symlink", path: "bin/sh", target: "x" },
      { kind: "chardev", path: "console", major: 5, minor: 1 },
    ])
    expect(archive.length % 4).toBe(0)
    const back = Cpio.readNewc(archive)
    expect(back.map((e) => e.path)).toEqual(["bin", "bin/x", "bin/sh", "console"])
    expect(back[1]?.data.toString()).toBe("hello")
    expect((back[1]?.mode ?? 0) & 0o777).toBe(0o755)
    expect(back[2]?.data.toString()).toBe("x")
    expect(back[3]?.rdev).toEqual([5, 1])
  })
})

describe("the initramfs", () => {
  it("holds /init, a static busybox and /dev/console", () => {
    const fakeStatic = Buffer.alloc(128)
    fakeStatic.writeUInt32BE(0x7f454c46, 0)
    fakeStatic[4] = 2
    const entries = Cpio.readNewc(gunzipSync(initramfs(fakeStatic)))
    expect(entries.map((e) => e.path)).toEqual(expect.arrayContaining(["init", "bin/busybox", "dev/console"]))
    expect(entries.find((e) => e.path === "init")?.data.toString()).toMatch(/^#!\/bin\/busybox sh/)
  })

  it("tells a static executable from a dynamic one", () => {
    // This test process's node is dynamically linked (it has an interpreter); its headers are
    // in the first 64 KiB (the whole binary is ~100 MB: too slow to read on a busy machine).
    const head = Buffer.alloc(64 * 1024)
    const fd = openSync(process.execPath, "r")
    readSync(fd, head, 0, head.length, 0)
    closeSync(fd)
    expect(isStaticElf(head)).toBe(false)
    expect(isStaticElf(Buffer.from("not an elf"))).toBe(false)
  })
})

describe("the console protocol", () => {
  it("puts the load on the command line", () => {
    expect(cmdline({ dirtyKibPerSec: 4096, hotMib: 32, tickMs: 50 })).toContain("engram.dirty_kib_s=4096 engram.hot_mib=32 engram.tick_ms=50")
    expect(cmdline({ fillMib: 768 })).toContain("engram.fill_mib=768")
    expect(cmdline({})).not.toContain("fill_mib")
  })

  it("says it is ready once, after its fill, and then with every counter line", () => {
    const id = "0b3c5a3e-1111-4222-8333-944455556666"
    expect(readyLine.test(`engram-ready ${id}`)).toBe(true)
    expect(readyLine.test(`engram-tick ${id} 3 1.5`)).toBe(true)
    expect(readyLine.test(`engram-guest boot=${id} dirty_kib_s=0`)).toBe(false)
  })

  it("reads counter lines and skips the rest", () => {
    const id = "0b3c5a3e-1111-4222-8333-944455556666"
    const text = `boot noise\r\nengram-tick ${id} 7 12.34\r\nengram-tick ${id} 8 12.5\npartial engram-tick\n`
    expect(ticks(text)).toEqual([
      { bootId: id, n: 7, uptimeS: 12.34 },
      { bootId: id, n: 8, uptimeS: 12.5 },
    ])
    expect(parseTick("engram-tick nope 1 1")).toBeNull()
  })
})
