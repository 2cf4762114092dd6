/**
 * Where descents put their captures: one image per session. A file directory in production,
 * memory in tests. A resumed (descended → pending) session is restored from its image.
 */
import { mkdir, readFile, rm, writeFile, rename } from "node:fs/promises"
import { join } from "node:path"
import { Effect, Ref } from "effect"
import type { Capture } from "./Runtime.js"

export interface ImageStore {
  readonly put: (capture: Capture) => Effect.Effect<void, Error>
  readonly get: (vmId: string) => Effect.Effect<Capture | undefined>
  readonly remove: (vmId: string) => Effect.Effect<void>
}

export const inMemory = (): Effect.Effect<ImageStore> =>
  Effect.map(Ref.make(new Map<string, Capture>()), (ref) => ({
    put: (c) => Ref.update(ref, (m) => new Map(m).set(c.vmId, c)),
    get: (id) => Effect.map(Ref.get(ref), (m) => m.get(id)),
    remove: (id) =>
      Ref.update(ref, (m) => {
        const n = new Map(m)
        n.delete(id)
        return n
      }),
  }))

const fileName = (vmId: string) => `${encodeURIComponent(vmId)}.img.json`

export const directory = (dir: string): ImageStore => ({
  put: (c) =>
    Effect.tryPromise({
      try: async () => {
        await mkdir(dir, { recursive: true })
        const path = join(dir, fileName(c.vmId))
        await writeFile(`${path}.tmp`, JSON.stringify({ ...c, payload: Buffer.from(c.payload).toString("base64") }))
        await rename(`${path}.tmp`, path)
      },
      catch: (e) => new Error(`image write failed: ${String(e)}`),
    }),
  get: (vmId) =>
    Effect.tryPromise(() => readFile(join(dir, fileName(vmId)), "utf8")).pipe(
      Effect.map((text): Capture | undefined => {
        const v = JSON.parse(text) as Omit<Capture, "payload"> & { payload: string }
        return { ...v, payload: new Uint8Array(Buffer.from(v.payload, "base64")) }
      }),
      Effect.orElseSucceed(() => undefined),
    ),
  remove: (vmId) => Effect.tryPromise(() => rm(join(dir, fileName(vmId)), { force: true })).pipe(Effect.ignore),
})
