/**
 * The image bearers' nonces an image host took, kept across its agent's restarts. An image bearer
 * (`MoveToken.imageToken`) is good for one request within `MoveToken.imageBearerWindowMs` of its
 * issue, either way of the image host's clock; the host refuses a nonce it took before. Kept in
 * memory only, a bearer seen on the wire in the window before a restart could be replayed once
 * after it. So every nonce taken is written to a small file (the image directory's
 * `~image-nonces-<host>.json`, beside the images it guards: where the images outlive a restart,
 * so does the file), atomically and synced, before the request is answered, and read back at
 * start; each entry is dropped once its bearer's window has passed (then its age refuses it
 * anyway), so the file holds one window's requests at most.
 *
 * Why a file rather than binding the bearers to a boot id the listing proves: the wire is
 * unchanged (agents of either version still fetch from each other), the listing's own bearer is
 * covered too (it is issued before the fetcher could learn a boot id), and the window stays 15
 * minutes either way of the image host's clock after a restart as before it. The cost is a small
 * synced write per image request (a fetch is one listing and a request per file).
 *
 * A file that is missing (the first start, or an agent older than this one ran before) or cannot
 * be read back: the agent does not know which bearers were used, so it refuses every bearer
 * issued before its own start (by its clock); bearers issued since are judged as always. That
 * costs a fetching host whose clock is behind this one's by d only the first d ms after such a
 * start. A nonce that cannot be written: the request is refused (503), not served unrecorded.
 */
import { mkdir, readFile, unlink } from "node:fs/promises"
import { dirname, join } from "node:path"
import { Durable } from "@engram/runtime"
import { Clock, Effect, Semaphore } from "effect"
import { type ImageBearer, imageBearerWindowMs, imageNonces } from "./MoveToken.js"

/** What the image host answers a bearer whose HMAC holds: "predates" a start that lost the record; "unrecorded" its nonce not written. */
export type Verdict = "ok" | "expired" | "replayed" | "predates" | "unrecorded"

/** Judges image bearers by their nonce and age, and records the nonces it takes. */
export interface NonceGate {
  readonly admit: (b: ImageBearer, nowMs: number) => Effect.Effect<Verdict>
}

/** The nonces in memory only (a restart forgets them): tests, and an agent without a file. */
export const inMemory = (windowMs: number = imageBearerWindowMs): NonceGate => {
  const nonces = imageNonces(windowMs)
  return { admit: (b, nowMs) => Effect.sync(() => nonces.admit(b, nowMs)) }
}

/** The nonce file of host `hostId` in the image directory `imageDir` (a `~` name: never taken for a session's). */
export const pathIn = (imageDir: string, hostId: string): string => join(imageDir, `~image-nonces-${encodeURIComponent(hostId)}.json`)

/** The file's form: each nonce taken with the end of its bearer's window (epoch ms). */
interface NonceFile {
  readonly version: 1
  readonly nonces: Readonly<Record<string, number>>
}

const read = async (path: string): Promise<NonceFile["nonces"] | "missing" | "unreadable"> => {
  let text: string
  try {
    text = await readFile(path, "utf8")
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "ENOENT" ? "missing" : "unreadable"
  }
  try {
    const v = JSON.parse(text) as Partial<NonceFile>
    if (v.version !== 1 || typeof v.nonces !== "object" || v.nonces === null) return "unreadable"
    for (const [n, until] of Object.entries(v.nonces)) if (!/^[0-9a-f]{32}$/.test(n) || typeof until !== "number") return "unreadable"
    return v.nonces
  } catch {
    return "unreadable"
  }
}

/** Writes `nonces` whole, atomically and durably (`Durable.replace`). */
const write = async (path: string, nonces: readonly (readonly [string, number])[]): Promise<void> => {
  // The operator's image directory is created on first use (a descent's, or this).
  await mkdir(dirname(path), { recursive: true, mode: 0o700 })
  // Synced with its directory, or a crash soon after may find the file of before, without the
  // nonce just taken, and a bearer used once could be used again.
  await Durable.replace(path, JSON.stringify({ version: 1, nonces: Object.fromEntries(nonces) } satisfies NonceFile), 0o600)
}

/**
 * The gate of an image host whose taken nonces are kept in `path`: read back now (the entries
 * whose window has passed dropped), each nonce it takes written before `admit` answers "ok".
 */
export const inFile = (path: string, hostId: string, windowMs: number = imageBearerWindowMs): Effect.Effect<NonceGate> =>
  Effect.gen(function* () {
    const startMs = yield* Clock.currentTimeMillis
    const nonces = imageNonces(windowMs)
    const found = yield* Effect.promise(() => read(path))
    // Without the record, no bearer issued before this start is known unused.
    let notBeforeMs: number | undefined
    if (typeof found === "object") {
      for (const [n, untilMs] of Object.entries(found)) if (untilMs >= startMs) nonces.remember(n, untilMs)
    } else {
      notBeforeMs = startMs
      if (found === "unreadable") yield* Effect.logWarning("the image bearers' nonce file cannot be read; image bearers issued before this start are refused", { hostId, path })
    }
    const writing = yield* Semaphore.make(1)
    /** Nonces taken so far, and how many of them the last finished write held. */
    let taken = 0
    let written = 0
    return {
      admit: (b, nowMs) =>
        Effect.gen(function* () {
          if (notBeforeMs !== undefined && b.issuedAtMs < notBeforeMs && Math.abs(nowMs - b.issuedAtMs) <= windowMs) return "predates" as const
          const judged = nonces.admit(b, nowMs)
          if (judged !== "ok") return judged
          const mine = ++taken
          // Each write holds every nonce taken so far: one taken while another's write waited or
          // ran may already be in a finished write (then nothing more to write), else in the next.
          return yield* Effect.gen(function* () {
            if (written >= mine) return "ok" as const
            const holding = taken
            yield* Effect.tryPromise(() => write(path, nonces.entries()))
            written = holding
            return "ok" as const
          }).pipe(
            writing.withPermits(1),
            Effect.catch((e) =>
              // Without the file (removed: an unlink needs no room, so a full disk allows it) the
              // next start refuses every bearer issued before it: no replay either way, and this
              // request is served (refusing it would make a resume placed elsewhere boot fresh).
              Effect.tryPromise(() => unlink(path).catch((u: NodeJS.ErrnoException) => (u.code === "ENOENT" ? undefined : Promise.reject(u)))).pipe(
                Effect.andThen(
                  Effect.logWarning("an image bearer's nonce could not be written; the nonce file is removed, so the next start refuses bearers issued before it; the request is served", {
                    hostId,
                    path,
                    error: String(e.cause ?? e),
                  }),
                ),
                Effect.as("ok" as const),
                Effect.catch((u) =>
                  Effect.logError("an image bearer's nonce could not be recorded nor its file removed; the request is refused", {
                    hostId,
                    path,
                    error: String(e.cause ?? e),
                    removeError: String(u.cause ?? u),
                  }).pipe(Effect.as("unrecorded" as const)),
                ),
              ),
            ),
          )
        }),
    }
  })
