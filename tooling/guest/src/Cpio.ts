/**
 * A writer of `newc` cpio archives (the format the Linux kernel unpacks as an initramfs), so
 * the guest's initramfs is built without the `cpio` program.
 */

/** One archive entry. Paths are relative (`init`, `bin/busybox`); directories come before their contents. */
export type CpioEntry =
  | { readonly kind: "dir"; readonly path: string; readonly mode?: number }
  | { readonly kind: "file"; readonly path: string; readonly data: Uint8Array; readonly mode?: number }
  | { readonly kind: "symlink"; readonly path: string; readonly target: string }
  | { readonly kind: "chardev"; readonly path: string; readonly major: number; readonly minor: number; readonly mode?: number }

const S_IFDIR = 0o040000
const S_IFREG = 0o100000
const S_IFLNK = 0o120000
const S_IFCHR = 0o020000

const hex8 = (n: number) => n.toString(16).padStart(8, "0")
const pad4 = (n: number) => (4 - (n % 4)) % 4

/** Builds the archive: the entries in order, then the trailer. */
export const newc = (entries: readonly CpioEntry[], mtime = 0): Uint8Array => {
  const parts: Buffer[] = []
  let offset = 0
  const push = (b: Buffer) => {
    parts.push(b)
    offset += b.length
  }
  const record = (ino: number, mode: number, data: Uint8Array, name: string, rdev: readonly [number, number] = [0, 0]) => {
    const nameBytes = Buffer.from(`${name}\0`, "utf8")
    const header =
      "070701" +
      [ino, mode, 0, 0, mode & S_IFDIR ? 2 : 1, mtime, data.length, 0, 0, rdev[0], rdev[1], nameBytes.length, 0].map(hex8).join("")
    push(Buffer.from(header, "ascii"))
    push(nameBytes)
    push(Buffer.alloc(pad4(offset)))
    push(Buffer.from(data))
    push(Buffer.alloc(pad4(offset)))
  }
  entries.forEach((e, i) => {
    const ino = i + 1
    switch (e.kind) {
      case "dir":
        return record(ino, S_IFDIR | (e.mode ?? 0o755), new Uint8Array(0), e.path)
      case "file":
        return record(ino, S_IFREG | (e.mode ?? 0o644), e.data, e.path)
      case "symlink":
        return record(ino, S_IFLNK | 0o777, Buffer.from(e.target, "utf8"), e.path)
      case "chardev":
        return record(ino, S_IFCHR | (e.mode ?? 0o600), new Uint8Array(0), e.path, [e.major, e.minor])
    }
  })
  record(0, 0, new Uint8Array(0), "TRAILER!!!")
  return Buffer.concat(parts)
}

/** Reads a `newc` archive back (for tests): each entry's path, mode and data. */
export const readNewc = (archive: Uint8Array): { path: string; mode: number; data: Buffer; rdev: [number, number] }[] => {
  const buf = Buffer.from(archive)
  const out: { path: string; mode: number; data: Buffer; rdev: [number, number] }[] = []
  let at = 0
  for (;;) {
    if (buf.toString("ascii", at, at + 6) !== "070701") throw new Error(`bad cpio magic at ${at}`)
    const field = (i: number) => parseInt(buf.toString("ascii", at + 6 + i * 8, at + 14 + i * 8), 16)
    const mode = field(1)
    const size = field(6)
    const rdev: [number, number] = [field(9), field(10)]
    const nameSize = field(11)
    const nameAt = at + 110
    const path = buf.toString("utf8", nameAt, nameAt + nameSize - 1)
    let dataAt = nameAt + nameSize
    dataAt += pad4(dataAt)
    if (path === "TRAILER!!!") return out
    out.push({ path, mode, data: buf.subarray(dataAt, dataAt + size), rdev })
    at = dataAt + size
    at += pad4(at)
  }
}
