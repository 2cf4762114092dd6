/**
 * The simulator's event queue: a binary min-heap on (time, sequence), so events at the same
 * simulated millisecond run in the order they were scheduled and every run is reproducible.
 */

/** A scheduled event: `kind` and `subject` are the simulator's own codes. */
export interface Scheduled {
  readonly t: number
  readonly seq: number
  readonly kind: number
  readonly subject: number
}

const before = (a: Scheduled, b: Scheduled): boolean => a.t < b.t || (a.t === b.t && a.seq < b.seq)

/** A min-heap of scheduled events. */
export class EventHeap {
  private readonly items: Scheduled[] = []
  private seq = 0

  get size(): number {
    return this.items.length
  }

  /** Schedules `kind` for `subject` at time `t`. */
  push(t: number, kind: number, subject: number): void {
    const items = this.items
    const e: Scheduled = { t, seq: this.seq++, kind, subject }
    let i = items.length
    items.push(e)
    while (i > 0) {
      const parent = (i - 1) >> 1
      const p = items[parent] as Scheduled
      if (!before(e, p)) break
      items[i] = p
      i = parent
    }
    items[i] = e
  }

  /** The earliest event, without removing it. */
  peek(): Scheduled | undefined {
    return this.items[0]
  }

  /** Removes and answers the earliest event. */
  pop(): Scheduled | undefined {
    const items = this.items
    const top = items[0]
    const last = items.pop()
    if (top === undefined || last === undefined || items.length === 0) return top
    let i = 0
    const n = items.length
    for (;;) {
      const l = 2 * i + 1
      if (l >= n) break
      const r = l + 1
      let c = l
      if (r < n && before(items[r] as Scheduled, items[l] as Scheduled)) c = r
      const child = items[c] as Scheduled
      if (!before(child, last)) break
      items[i] = child
      i = c
    }
    items[i] = last
    return top
  }
}
