/**
 * When a guest is ready (SPEC §13, "running means ready"): the guest's own signal, a line on its
 * serial console that matches the runtime's pattern, written after a given point of the console
 * file (a boot: from its start; a resume: from where the console was at `cont`). The console is
 * a file QEMU appends to; this module reads what was appended, polling on Effect's Clock.
 *
 * A resume's tail is started before its `cont` (`tailFromEnd`): its first read, the console's
 * size, is made then, and a read that stalls is waited for by the tail, not made again after
 * `cont` (a ready line the guest wrote meanwhile would be before the point read from, missed).
 *
 * The console is on the disk that holds the VM's state and RAM file, which can stall: every read
 * is asynchronous (the agent's event loop, its heartbeats, runs on meanwhile) and bounded
 * (`readBoundMs`), one read of a console at a time.
 */
import { open } from "node:fs/promises"
import { StringDecoder } from "node:string_decoder"
import { Effect, Option, Schedule } from "effect"
import { readBoundMs } from "./QemuProcess.js"

/**
 * Reads `path` from `offset` on: the bytes there now (empty at its end, or while the file is
 * absent). `from: "end"`: none, the file's size is the offset (what a tail from None begins at).
 */
export type ReadFrom = (path: string, offset: number | "end") => Promise<{ readonly bytes: Buffer; readonly size: number }>

/** Reads the file with one handle: from `offset` to its end, 64 KiB at a time. */
export const readFrom: ReadFrom = async (path, offset) => {
  let handle
  try {
    handle = await open(path, "r")
  } catch {
    return { bytes: Buffer.alloc(0), size: offset === "end" ? 0 : offset }
  }
  try {
    if (offset === "end") return { bytes: Buffer.alloc(0), size: (await handle.stat()).size }
    const chunks: Buffer[] = []
    let at = offset
    for (;;) {
      const chunk = Buffer.alloc(64 * 1024)
      const { bytesRead } = await handle.read(chunk, 0, chunk.length, at)
      if (bytesRead <= 0) break
      at += bytesRead
      chunks.push(chunk.subarray(0, bytesRead))
    }
    return { bytes: Buffer.concat(chunks), size: at }
  } finally {
    await handle.close()
  }
}

/** Reads the console from a point on, line by line (a line counts once it is whole). */
export class ConsoleTail {
  private buffer = ""
  /** Keeps a character split between two reads until its last bytes come. */
  private readonly decoder = new StringDecoder("utf8")
  private offset: number | "end"
  /** The read under way (one at a time: a stalled one is waited for again, not doubled). */
  private reading: Promise<void> | null = null
  constructor(
    private readonly path: string,
    offset: number | "end",
    private readonly read: ReadFrom = readFrom,
    private readonly boundMs = readBoundMs,
  ) {
    this.offset = offset
  }

  /**
   * The whole lines appended since the last call. A read that does not answer within the bound
   * goes on (the next call waits for it again): the call answers the lines earlier reads brought
   * (a read that answered late: its lines at the next call, before any other read).
   */
  lines(): Effect.Effect<string[]> {
    return Effect.suspend(() => {
      // Whole lines a late read brought, taken before another read.
      if (this.reading === null && this.buffer.includes("\n")) return Effect.void
      this.reading ??= this.read(this.path, this.offset).then(
        ({ bytes, size }) => {
          this.offset = size
          this.buffer += this.decoder.write(bytes)
        },
        () => undefined,
      ).finally(() => {
        this.reading = null
      })
      const reading = this.reading
      return Effect.promise(() => reading).pipe(Effect.timeoutOption(this.boundMs))
    }).pipe(
      Effect.map(() => {
        const parts = this.buffer.split("\n")
        this.buffer = parts.pop() ?? ""
        return parts.map((l) => l.replace(/\r$/, ""))
      }),
    )
  }
}

/**
 * A tail of the console from where it ends now (0 while QEMU has not created it): its first read,
 * the console's size, is made at once and waited for within `boundMs`. One that does not answer
 * in time goes on, and the tail's next read waits for it: a resume starts its tail before `cont`,
 * so the point it reads from is the size looked up before the guest ran, not one read after it
 * (when a ready line written meanwhile would be before it). `read`: how the console is read (tests).
 */
export const tailFromEnd = (path: string, read: ReadFrom = readFrom, boundMs = readBoundMs): Effect.Effect<ConsoleTail> =>
  Effect.suspend(() => {
    const tail = new ConsoleTail(path, "end", read, boundMs)
    return Effect.as(tail.lines(), tail)
  })

/** How a wait for the ready line ended. */
export type Seen = "seen" | "timeout" | "exited"

/**
 * Waits until a line matching `pattern` appears in the console after `from` (a byte offset, or a
 * tail already started: `tailFromEnd`, its own path and reader), within `timeoutMs` (polled every
 * `pollMs` on Effect's Clock, each read within `readBoundMs`); a guest whose process is gone
 * (`alive` false) stops the wait at once. `read`: how the console is read (tests).
 */
export const awaitLine = (
  path: string,
  from: number | ConsoleTail,
  pattern: RegExp,
  timeoutMs: number,
  alive: () => boolean = () => true,
  pollMs = 5,
  read?: ReadFrom,
): Effect.Effect<Seen> =>
  Effect.suspend(() => {
    const tail = typeof from === "number" ? new ConsoleTail(path, from, read) : from
    const poll = Effect.flatMap(tail.lines(), (lines): Effect.Effect<Seen, "not yet"> => {
      if (lines.some((l) => pattern.test(l))) return Effect.succeed("seen")
      return alive() ? Effect.fail("not yet") : Effect.succeed("exited")
    })
    return poll.pipe(
      Effect.retry({ schedule: Schedule.spaced(`${pollMs} millis`) }),
      // Retried until it answers; the error channel only says so.
      Effect.orElseSucceed((): Seen => "timeout"),
      Effect.timeoutOption(timeoutMs),
      Effect.map((o): Seen => (Option.isSome(o) ? o.value : "timeout")),
    )
  })
