/**
 * Guest RAM as a file: QEMU's `memory-backend-file` with `share=on`, so the guest's memory is
 * the file's pages and a snapshot needs only the devices (`x-ignore-shared`) beside the file.
 * This module decides how such a file moves between
 * a VM, a descent's image and a template: a rename on one filesystem (instant), else a sparse
 * copy (only the extents the guest touched, zero blocks left as holes) that is fsynced.
 */
import { spawn } from "node:child_process"
import { rename, rm, stat } from "node:fs/promises"
import { dirname } from "node:path"
import { Durable } from "@engram/runtime"
import { Effect } from "effect"

/**
 * Where a VM's RAM lives. `file` + `shared`: the guest writes the file (a snapshot needs only
 * its devices); `file` without `shared`: a private copy-on-write mapping of the file (the file
 * stays as it was; a snapshot must stream the RAM); `anonymous`: QEMU's own memory.
 */
export type RamBacking = { readonly kind: "anonymous" } | { readonly kind: "file"; readonly path: string; readonly shared: boolean }

/** A file operation failed. */
export class RamFileError extends Error {}

const attempt = <A>(what: string, f: () => Promise<A>): Effect.Effect<A, RamFileError> =>
  Effect.tryPromise({ try: f, catch: (e) => new RamFileError(`${what}: ${e instanceof Error ? e.message : String(e)}`) })

/** Whether `path` and the directory `dir` are on one filesystem (a rename between them is atomic and free). */
export const sameFilesystem = (path: string, dir: string): Effect.Effect<boolean> =>
  attempt("stat", async () => (await stat(path)).dev === (await stat(dir)).dev).pipe(Effect.orElseSucceed(() => false))

/** Whether two paths name one file (two links of one inode); false when either is missing. */
export const sameFile = (a: string, b: string): Effect.Effect<boolean> =>
  attempt("stat", async () => {
    const [x, y] = await Promise.all([stat(a), stat(b)])
    return x.dev === y.dev && x.ino === y.ino
  }).pipe(Effect.orElseSucceed(() => false))

/** Writes a file's dirty pages to its disk: they are then clean page cache, which the kernel may drop. */
export const fsync = (path: string): Effect.Effect<void, RamFileError> => attempt(`fsync ${path}`, () => Durable.syncPath(path))

/** The bytes a file holds on its filesystem (a sparse RAM file: what the guest touched). */
export const allocatedBytes = (path: string): Effect.Effect<number> =>
  attempt("stat", async () => (await stat(path)).blocks * 512).pipe(Effect.orElseSucceed(() => 0))

/**
 * Copies `from` to `to` sparsely: GNU cp skips holes (SEEK_DATA) and writes zero blocks as
 * holes, so only what the guest touched is read and written. Written aside and renamed; with
 * `durable` fsynced before the rename.
 */
export const sparseCopy = (from: string, to: string, options: { readonly durable: boolean }): Effect.Effect<void, RamFileError> =>
  Effect.gen(function* () {
    const part = `${to}.part`
    yield* Effect.callback<void, RamFileError>((resume) => {
      const cp = spawn("cp", ["--sparse=always", "--", from, part], { stdio: ["ignore", "ignore", "pipe"] })
      let stderr = ""
      cp.stderr.on("data", (d: Buffer) => (stderr += d.toString()))
      cp.on("error", (e) => resume(Effect.fail(new RamFileError(`cp: ${e.message}`))))
      cp.on("close", (code) => resume(code === 0 ? Effect.void : Effect.fail(new RamFileError(`cp ${from}: exit ${code}: ${stderr.trim()}`))))
      return Effect.sync(() => void cp.kill("SIGKILL"))
    })
    if (options.durable) yield* fsync(part)
    yield* attempt(`rename ${part}`, () => rename(part, to))
  }).pipe(Effect.tapError(() => Effect.promise(() => rm(`${to}.part`, { force: true }))))

/** How a RAM file got where it went. */
export type Placed = "renamed" | "copied"

/**
 * Moves a RAM file to `to`, durably: fsync and rename when both are on one filesystem, else a
 * sparse copy (fsynced) and the original removed. The file may be mapped by a paused QEMU:
 * a rename keeps its mapping, a copy reads what the guest last wrote.
 */
export const place = (from: string, to: string): Effect.Effect<Placed, RamFileError> =>
  Effect.gen(function* () {
    if (yield* sameFilesystem(from, dirname(to))) {
      yield* fsync(from)
      yield* attempt(`rename ${from}`, () => rename(from, to))
      return "renamed" as const
    }
    yield* sparseCopy(from, to, { durable: true })
    yield* attempt(`remove ${from}`, () => rm(from, { force: true }))
    return "copied" as const
  })

/** Renames `from` back to `to` after a failed step; never fails (a missing file is left missing). */
export const putBack = (from: string, to: string): Effect.Effect<void> => attempt("rename", () => rename(from, to)).pipe(Effect.ignore)
