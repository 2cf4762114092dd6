/**
 * Builds (once, into a cache directory) the test guest: the Debian `linux-image-amd64` kernel,
 * fetched with `apt-get download` and unpacked with `dpkg-deb` (no install, so no initramfs
 * rebuild), and a busybox initramfs written here (cpio `newc` + gzip, no `cpio` needed). Needs
 * `busybox-static` installed and apt's package lists (`apt-get update`) for the kernel.
 */
import { execFile, spawn } from "node:child_process"
import { createHash } from "node:crypto"
import { existsSync, readFileSync } from "node:fs"
import { mkdir, readdir, rename, rm, writeFile } from "node:fs/promises"
import path from "node:path"
import { fileURLToPath } from "node:url"
import { promisify } from "node:util"
import { gzipSync } from "node:zlib"
import { newc } from "./Cpio.js"
import { calmLoad, cmdline, initScript, readyLine, type GuestLoad } from "./Init.js"

const run = promisify(execFile)

/** Where the guest is cached by default: `<repo>/.tmp/guest` (git-ignored). */
export const defaultCacheDir = path.join(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "..", ".tmp", "guest")

/** A built guest: boot it with `-kernel kernel -initrd initrd -append cmdline(...)`. */
export interface Guest {
  readonly kernel: string
  readonly initrd: string
  /** The Debian kernel package the kernel came from. */
  readonly kernelPackage: string
}

export interface GuestOptions {
  readonly cacheDir?: string
  /** A static busybox. Default `$ENGRAM_GUEST_BUSYBOX` or `/bin/busybox` (package busybox-static). */
  readonly busybox?: string
  /** Use this kernel instead of fetching one. Default `$ENGRAM_GUEST_KERNEL`. */
  readonly kernel?: string
  /** Progress lines (fetching, building). */
  readonly log?: (line: string) => void
}

/** Whether an ELF executable is static (no PT_INTERP program header). */
export const isStaticElf = (bytes: Uint8Array): boolean => {
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  if (b.length < 64 || b.readUInt32BE(0) !== 0x7f454c46 || b[4] !== 2) return false
  const phoff = Number(b.readBigUInt64LE(0x20))
  const phentsize = b.readUInt16LE(0x36)
  const phnum = b.readUInt16LE(0x38)
  for (let i = 0; i < phnum; i++) {
    const at = phoff + i * phentsize
    if (at + 4 > b.length) return false
    if (b.readUInt32LE(at) === 3) return false
  }
  return true
}

/** The initramfs for a static busybox: `/init`, `/bin/busybox`, the mount points and `/dev/console`. */
export const initramfs = (busybox: Uint8Array): Uint8Array =>
  gzipSync(
    newc([
      { kind: "dir", path: "bin" },
      { kind: "dir", path: "dev" },
      { kind: "chardev", path: "dev/console", major: 5, minor: 1 },
      { kind: "dir", path: "proc" },
      { kind: "dir", path: "sys" },
      { kind: "dir", path: "run" },
      { kind: "dir", path: "tmp", mode: 0o1777 },
      { kind: "file", path: "bin/busybox", data: busybox, mode: 0o755 },
      { kind: "symlink", path: "bin/sh", target: "busybox" },
      { kind: "file", path: "init", data: Buffer.from(initScript, "utf8"), mode: 0o755 },
    ]),
    { level: 6 },
  )

const atomicWrite = async (file: string, data: Uint8Array) => {
  const tmp = `${file}.tmp-${process.pid}`
  await writeFile(tmp, data)
  await rename(tmp, file)
}

/** The package `linux-image-amd64` depends on (the versioned kernel image). */
const kernelPackageName = async (): Promise<string> => {
  const { stdout } = await run("apt-cache", ["depends", "linux-image-amd64"])
  const m = /Depends:\s*(linux-image-[^\s]+)/.exec(stdout)
  if (m?.[1] === undefined) throw new Error("apt-cache knows no linux-image-amd64: run `apt-get update` first")
  return m[1]
}

const fetchKernel = async (dir: string, log: (l: string) => void): Promise<{ kernel: string; pkg: string }> => {
  const pkg = await kernelPackageName()
  const kernel = path.join(dir, `vmlinuz-${pkg.replace(/^linux-image-/, "")}`)
  if (existsSync(kernel)) return { kernel, pkg }
  const work = path.join(dir, `deb-${process.pid}`)
  await mkdir(work, { recursive: true })
  try {
    log(`guest: apt-get download ${pkg}`)
    await run("apt-get", ["download", pkg], { cwd: work, maxBuffer: 16 * 1024 * 1024 })
    const deb = (await readdir(work)).find((f) => f.endsWith(".deb"))
    if (deb === undefined) throw new Error(`apt-get download ${pkg} left no .deb`)
    // Only the kernel: `dpkg-deb -x` would unpack every module too.
    log(`guest: extracting vmlinuz from ${deb}`)
    await new Promise<void>((resolve, reject) => {
      const dpkg = spawn("dpkg-deb", ["--fsys-tarfile", path.join(work, deb)], { stdio: ["ignore", "pipe", "inherit"] })
      const tar = spawn("tar", ["-x", "-C", work, "--wildcards", "./boot/vmlinuz-*"], { stdio: ["pipe", "inherit", "inherit"] })
      dpkg.stdout.pipe(tar.stdin)
      dpkg.on("error", reject)
      tar.on("error", reject)
      tar.on("close", (code) => (code === 0 ? resolve() : reject(new Error(`tar exited ${code}`))))
    })
    const boot = path.join(work, "boot")
    const vmlinuz = (await readdir(boot)).find((f) => f.startsWith("vmlinuz-"))
    if (vmlinuz === undefined) throw new Error(`${deb} holds no boot/vmlinuz-*`)
    await rename(path.join(boot, vmlinuz), kernel)
    return { kernel, pkg }
  } finally {
    await rm(work, { recursive: true, force: true })
  }
}

/** Builds what is missing of the guest and answers its files. Safe to call from several processes. */
export const ensureGuest = async (options: GuestOptions = {}): Promise<Guest> => {
  const log = options.log ?? (() => undefined)
  const dir = options.cacheDir ?? process.env["ENGRAM_GUEST_CACHE"] ?? defaultCacheDir
  await mkdir(dir, { recursive: true })
  const busyboxPath = options.busybox ?? process.env["ENGRAM_GUEST_BUSYBOX"] ?? "/bin/busybox"
  if (!existsSync(busyboxPath)) throw new Error(`no busybox at ${busyboxPath}: apt-get install busybox-static`)
  const busybox = readFileSync(busyboxPath)
  if (!isStaticElf(busybox)) throw new Error(`${busyboxPath} is not a static executable: apt-get install busybox-static`)
  const digest = createHash("sha256").update(busybox).update(initScript).digest("hex").slice(0, 12)
  const initrd = path.join(dir, `initramfs-${digest}.cpio.gz`)
  if (!existsSync(initrd)) {
    log(`guest: building ${initrd}`)
    await atomicWrite(initrd, initramfs(busybox))
  }
  const given = options.kernel ?? process.env["ENGRAM_GUEST_KERNEL"]
  if (given !== undefined && given !== "") {
    if (!existsSync(given)) throw new Error(`no kernel at ${given}`)
    return { kernel: given, initrd, kernelPackage: "given" }
  }
  const { kernel, pkg } = await fetchKernel(dir, log)
  return { kernel, initrd, kernelPackage: pkg }
}

/**
 * The host agent's settings that boot this guest (`ENGRAM_QEMU_KERNEL`, `_INITRD`, `_APPEND`)
 * and say when it is ready (`ENGRAM_QEMU_READY_LINE`): the agent knows nothing of the test
 * guest, it boots a kernel like any other.
 */
export const agentEnvironment = async (load: GuestLoad = calmLoad, options: GuestOptions = {}): Promise<Record<string, string>> => {
  const guest = await ensureGuest(options)
  return { ENGRAM_QEMU_KERNEL: guest.kernel, ENGRAM_QEMU_INITRD: guest.initrd, ENGRAM_QEMU_APPEND: cmdline(load), ENGRAM_QEMU_READY_LINE: readyLine.source }
}
