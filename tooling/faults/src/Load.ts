/**
 * The client load of a scenario: workers that create sessions with fresh ids and end some of
 * the ones they created, recording every operation, until stopped. After a failed operation a
 * worker pauses briefly (pacing, so an outage does not turn into a tight loop of refused
 * connections; nothing is judged on time).
 */
import { setTimeout as delay } from "node:timers/promises"
import { acknowledged, type Recorder } from "./History.js"

/** A running load. */
export interface Load {
  /** Ids of the sessions whose create was acknowledged. */
  readonly created: readonly string[]
  /** Stops the workers and resolves once each finished its operation in flight. */
  readonly stop: () => Promise<void>
}

/** Starts `workers` workers: each creates a session of `memMib`, and every `endEvery`-th step ends its oldest live one. */
export const startLoad = (
  recorder: Recorder,
  o: { readonly prefix: string; readonly workers: number; readonly memMib: number; readonly endEvery?: number },
): Load => {
  let stopping = false
  const created: string[] = []
  let counter = 0
  const worker = async (w: number) => {
    const mine: string[] = []
    for (let step = 1; !stopping; step++) {
      const ending = o.endEvery !== undefined && step % o.endEvery === 0 && mine.length > 0
      const op = ending ? await recorder.end(mine.shift()!) : await recorder.create(`${o.prefix}-${w}-${(counter++).toString(36)}`, o.memMib)
      if (!ending && acknowledged(op) && op.id !== null) {
        mine.push(op.id)
        created.push(op.id)
      }
      if (!acknowledged(op)) await delay(100)
    }
  }
  const running = Array.from({ length: o.workers }, (_, w) => worker(w))
  return {
    created,
    stop: async () => {
      stopping = true
      await Promise.all(running)
    },
  }
}

/** Resolves once `predicate` holds, polling every `everyMs`; rejects after `timeoutMs` with `what`. */
export const until = async (what: string, predicate: () => boolean | Promise<boolean>, timeoutMs = 120_000, everyMs = 100): Promise<void> => {
  const deadline = Date.now() + timeoutMs
  while (!(await predicate())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await delay(everyMs)
  }
}
