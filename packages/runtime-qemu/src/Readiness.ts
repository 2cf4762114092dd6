/**
 * When a guest is ready (SPEC §13, "running means ready"): the guest's own signal, a line on its
 * serial console that matches the runtime's pattern, written after a given point of the console
 * file (a boot: from its start; a resume: from where the console was at `cont`). The console is
 * a file QEMU appends to; this module reads what was appended, polling on Effect's Clock.
 */
import { closeSync, openSync, readSync, statSync } from "node:fs"
import { Effect, Option, Schedule } from "effect"

/** The console's size now (0 while QEMU has not created it): the point a resume reads from. */
export const offsetOf = (path: string): number => {
  try {
    return statSync(path).size
  } catch {
    return 0
  }
}

/** Reads the console from a point on, line by line (a line counts once it is whole). */
export class ConsoleTail {
  private buffer = ""
  constructor(
    private readonly path: string,
    private offset: number,
  ) {}

  /** The whole lines appended since the last call. */
  lines(): string[] {
    let fd: number
    try {
      fd = openSync(this.path, "r")
    } catch {
      return []
    }
    try {
      const chunk = Buffer.alloc(64 * 1024)
      for (;;) {
        const n = readSync(fd, chunk, 0, chunk.length, this.offset)
        if (n <= 0) break
        this.offset += n
        this.buffer += chunk.toString("utf8", 0, n)
      }
    } finally {
      closeSync(fd)
    }
    const parts = this.buffer.split("\n")
    this.buffer = parts.pop() ?? ""
    return parts.map((l) => l.replace(/\r$/, ""))
  }
}

/** How a wait for the ready line ended. */
export type Seen = "seen" | "timeout" | "exited"

/**
 * Waits until a line matching `pattern` appears in the console after `offset`, within
 * `timeoutMs` (polled every `pollMs` on Effect's Clock); a guest whose process is gone
 * (`alive` false) stops the wait at once.
 */
export const awaitLine = (path: string, offset: number, pattern: RegExp, timeoutMs: number, alive: () => boolean = () => true, pollMs = 5): Effect.Effect<Seen> =>
  Effect.suspend(() => {
    const tail = new ConsoleTail(path, offset)
    const poll = Effect.suspend((): Effect.Effect<Seen, "not yet"> => {
      if (tail.lines().some((l) => pattern.test(l))) return Effect.succeed("seen")
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
