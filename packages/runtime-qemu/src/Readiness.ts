/**
 * When a guest is ready (SPEC §13, "running means ready"): the guest's own signal, a line on its
 * serial console that matches the runtime's pattern, written after a given point of the console
 * file (a boot: from its start; a resume: from where the console was at `cont`). The console is
 * a file QEMU appends to; this module reads what was appended, polling on Effect's Clock.
 *
 * The console is on the disk that holds the VM's state and RAM file, which can stall: every read
 * is asynchronous (the agent's event loop, its heartbeats, runs on meanwhile) and bounded
 * (`readBoundMs`), one read of a console at a time.
 */
import { open, stat } from "node:fs/promises"
import { StringDecoder } from "node:string_decoder"
import { Effect, Option, Schedule } from "effect"
import { readBoundMs } from "./QemuProcess.js"

/**
 * The console's size now (0 while QEMU has not created it): the point a resume reads from. None
 * when its size did not answer within `boundMs`: a tail from None reads from where the console
 * ends at its first read.
 */
export const offsetOf = (path: string, boundMs = readBoundMs): Effect.Effect<Option.Option<number>> =>
  Effect.promise(() => stat(path).then((s) => s.size, () => 0)).pipe(Effect.timeoutOption(boundMs))

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
    offset: Option.Option<number> | number,
    private readonly read: ReadFrom = readFrom,
    private readonly boundMs = readBoundMs,
  ) {
    this.offset = typeof offset === "number" ? offset : Option.getOrElse(offset, () => "end" as const)
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

/** How a wait for the ready line ended. */
export type Seen = "seen" | "timeout" | "exited"

/**
 * Waits until a line matching `pattern` appears in the console after `offset` (None: from where
 * the console ends at the first read), within `timeoutMs` (polled every `pollMs` on Effect's
 * Clock, each read within `readBoundMs`); a guest whose process is gone (`alive` false) stops the
 * wait at once. `read`: how the console is read (tests).
 */
export const awaitLine = (
  path: string,
  offset: Option.Option<number> | number,
  pattern: RegExp,
  timeoutMs: number,
  alive: () => boolean = () => true,
  pollMs = 5,
  read?: ReadFrom,
): Effect.Effect<Seen> =>
  Effect.suspend(() => {
    const tail = new ConsoleTail(path, offset, read)
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
