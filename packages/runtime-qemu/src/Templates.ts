/**
 * The templates a QEMU runtime holds, on disk under `<stateDir>/@templates/<name>/`: `state`
 * (the paused guest's migration stream: its devices, and its RAM too for a `stream` template),
 * `ram` (the guest's RAM file, for a `mapped` one) and `template.json` (the size, the machine
 * it must be started on, and how it holds its RAM). A template is built aside (`.<name>.part`)
 * and renamed into place, so one that exists is complete. (`@` is no character of a VM id, so
 * the directory never meets a VM's.)
 */
import { readdir, readFile, rename, rm, writeFile } from "node:fs/promises"
import { join } from "node:path"
import { Names } from "@engram/core"
import { pathSegment } from "@engram/runtime"
import type { SnapshotMethod, TemplateInfo, TemplateSpec } from "@engram/runtime"
import { Effect } from "effect"
import type { Machine } from "./QemuProcess.js"
import * as RamFile from "./RamFile.js"

/** What `template.json` records. */
export interface TemplateRecord {
  readonly engram: "qemu-template/v1"
  readonly spec: TemplateSpec
  readonly machine: Machine
  readonly method: SnapshotMethod
}

/** The files of the template `name` (or of its build, `part`). */
export interface TemplatePaths {
  readonly dir: string
  readonly state: string
  readonly ram: string
  readonly record: string
}

/** The directory of every template of a runtime. */
export const rootOf = (stateDir: string): string => join(stateDir, "@templates")

/** Whether `name` can name a template: core's one rule (`Names.isTemplateName`), a plain file name that is not hidden. */
export const validName = (name: string): boolean => Names.isTemplateName(name)

const filesIn = (dir: string): TemplatePaths => ({ dir, state: join(dir, "state"), ram: join(dir, "ram"), record: join(dir, "template.json") })

/** The files of the template `name`. */
export const pathsOf = (stateDir: string, name: string): TemplatePaths => filesIn(join(rootOf(stateDir), pathSegment(name)))

/** Where the template `name` is built before it is renamed into place. */
export const partOf = (stateDir: string, name: string): TemplatePaths => filesIn(join(rootOf(stateDir), `.${encodeURIComponent(name)}.part`))

/** The record of the template `name`; undefined when there is none (or it does not parse). */
export const read = (stateDir: string, name: string): Effect.Effect<TemplateRecord | undefined> =>
  Effect.tryPromise(() => readFile(pathsOf(stateDir, name).record, "utf8")).pipe(
    Effect.map((text) => {
      try {
        const r = JSON.parse(text) as Partial<TemplateRecord>
        return r.engram === "qemu-template/v1" && r.spec !== undefined && r.machine !== undefined ? (r as TemplateRecord) : undefined
      } catch {
        return undefined
      }
    }),
    Effect.orElseSucceed(() => undefined),
  )

/** The size of a template's files on disk. */
export const bytesOf = (paths: TemplatePaths): Effect.Effect<number> =>
  Effect.map(Effect.all([RamFile.allocatedBytes(paths.state), RamFile.allocatedBytes(paths.ram)]), ([a, b]) => a + b)

/** Every complete template. */
export const list = (stateDir: string): Effect.Effect<TemplateInfo[]> =>
  Effect.gen(function* () {
    const names = yield* Effect.tryPromise(() => readdir(rootOf(stateDir))).pipe(Effect.orElseSucceed((): string[] => []))
    const out: TemplateInfo[] = []
    for (const entry of names.filter((n) => !n.startsWith(".")).sort()) {
      const name = decodeURIComponent(entry)
      const record = yield* read(stateDir, name)
      if (record === undefined) continue
      out.push({ ...record.spec, method: record.method, bytes: yield* bytesOf(pathsOf(stateDir, name)) })
    }
    return out
  })

/** Writes the record into a built template's directory and renames it into place (replacing one of that name). */
export const commit = (stateDir: string, part: TemplatePaths, record: TemplateRecord): Effect.Effect<void, RamFile.RamFileError> =>
  Effect.tryPromise({
    try: async () => {
      await writeFile(part.record, JSON.stringify(record, null, 2))
      const dest = pathsOf(stateDir, record.spec.name)
      await rm(dest.dir, { recursive: true, force: true })
      await rename(part.dir, dest.dir)
    },
    catch: (e) => new RamFile.RamFileError(`template ${record.spec.name}: ${String(e)}`),
  })

/** Removes a template (or a build's leftovers); never fails. */
export const remove = (paths: TemplatePaths): Effect.Effect<void> => Effect.promise(() => rm(paths.dir, { recursive: true, force: true }))
