/**
 * A mutable placement index for stores that hold thousands of hosts in memory: it answers
 * `pick` exactly as `Placement.pick` does over the same candidates, in O(log n + k) instead of
 * O(n). Hosts are kept sorted by the ranking key (free RAM, free vCPUs, id); a pick binary
 * searches the first host with enough RAM and walks up to the first whose CPU also fits.
 * Property tests pin `Index.pick === Placement.pick` after random updates. The measured hosts
 * that hold a template are also filed per template (name and size), so a request for one finds
 * its best-fitting holder by the same search. Each block of a sorted list counts its hosts that
 * take moves, so a pick for a move without a named target (`takesMovesOnly`) passes a block of
 * hosts that take none in one step, not host by host.
 */
import * as Headroom from "./Headroom.js"
import type { Budget } from "./Headroom.js"
import { defaults, type Limits } from "./Limits.js"
import * as Placement from "./Placement.js"
import type { Candidate, Choice, Chosen, HeldTemplate, Request } from "./Placement.js"

interface Slot {
  readonly c: Candidate
  /** The ranking key: free RAM (`Headroom.freeMib`, null = Infinity). */
  readonly mib: number
  /** The ranking key's tie-break: free vCPUs (`Headroom.freeVcpus`, null = Infinity). */
  readonly vcpus: number
  /** The fit limits (`Headroom.fitLimit`): what actually fits, Infinity where not gated. */
  readonly fitMib: number
  readonly fitVcpus: number
  /** Whether a move without a named target may pick it (`Placement.acceptsMoves`). */
  readonly movesIn: boolean
}

const cmpSlot = (a: Slot, b: Slot): number =>
  a.mib !== b.mib ? (a.mib < b.mib ? -1 : 1) : a.vcpus !== b.vcpus ? (a.vcpus < b.vcpus ? -1 : 1) : a.c.id < b.c.id ? -1 : a.c.id > b.c.id ? 1 : 0

/**
 * Slots sorted by the ranking key, held in blocks of at most `BLOCK` slots (a bucketed sorted
 * list): an insert or a remove binary-searches the block, then the slot within it, and splices
 * one block, O(log n + BLOCK) instead of moving every slot of a 10,000-host array. Each block
 * counts its slots that take moves (`movers`, beside `blocks`), kept on every insert, remove and
 * split, so a walk for those only skips a block without any.
 */
const BLOCK = 256

class Sorted {
  private blocks: Slot[][] = []
  /** Per block, how many of its slots take moves (`Slot.movesIn`). */
  private movers: number[] = []
  private count = 0

  private static moversIn(block: readonly Slot[]): number {
    let n = 0
    for (const s of block) if (s.movesIn) n++
    return n
  }

  get size(): number {
    return this.count
  }

  /** Replaces every slot with `slots`, already sorted by `cmpSlot`: one pass, no search per slot. */
  load(slots: readonly Slot[]): void {
    this.blocks = []
    for (let i = 0; i < slots.length; i += BLOCK) this.blocks.push(slots.slice(i, i + BLOCK))
    this.movers = this.blocks.map(Sorted.moversIn)
    this.count = slots.length
  }

  // The block a slot with this key belongs in: the first whose last slot is >= it (else the last block).
  private blockFor(s: Slot): number {
    const blocks = this.blocks
    let lo = 0
    let hi = blocks.length - 1
    while (lo < hi) {
      const mid = (lo + hi) >>> 1
      const b = blocks[mid] as Slot[]
      if (cmpSlot(b[b.length - 1] as Slot, s) < 0) lo = mid + 1
      else hi = mid
    }
    return lo
  }

  private static find(block: readonly Slot[], s: Slot): number {
    let lo = 0
    let hi = block.length
    while (lo < hi) {
      const mid = (lo + hi) >>> 1
      if (cmpSlot(block[mid] as Slot, s) < 0) lo = mid + 1
      else hi = mid
    }
    return lo
  }

  insert(s: Slot): void {
    this.count++
    if (this.blocks.length === 0) {
      this.blocks.push([s])
      this.movers.push(s.movesIn ? 1 : 0)
      return
    }
    const bi = this.blockFor(s)
    const block = this.blocks[bi] as Slot[]
    block.splice(Sorted.find(block, s), 0, s)
    let movers = (this.movers[bi] as number) + (s.movesIn ? 1 : 0)
    if (block.length > 2 * BLOCK) {
      const upper = block.splice(BLOCK)
      const moved = Sorted.moversIn(upper)
      this.blocks.splice(bi + 1, 0, upper)
      this.movers.splice(bi + 1, 0, moved)
      movers -= moved
    }
    this.movers[bi] = movers
  }

  remove(s: Slot): void {
    if (this.blocks.length === 0) return
    const bi = this.blockFor(s)
    const block = this.blocks[bi] as Slot[]
    const i = Sorted.find(block, s)
    if (block[i] !== s) return
    block.splice(i, 1)
    if (s.movesIn) this.movers[bi] = (this.movers[bi] as number) - 1
    this.count--
    if (block.length === 0) {
      this.blocks.splice(bi, 1)
      this.movers.splice(bi, 1)
    }
  }

  /** The slots in order, from the first whose key is >= (mib, vcpus); with `moversOnly`, blocks without a slot that takes moves are passed. */
  *from(mib: number, vcpus = Number.NEGATIVE_INFINITY, moversOnly = false): Generator<Slot> {
    const blocks = this.blocks
    const below = (m: Slot): boolean => m.mib < mib || (m.mib === mib && m.vcpus < vcpus)
    let lo = 0
    let hi = blocks.length
    // The first block whose last slot is not below the key.
    while (lo < hi) {
      const mid = (lo + hi) >>> 1
      const b = blocks[mid] as Slot[]
      if (below(b[b.length - 1] as Slot)) lo = mid + 1
      else hi = mid
    }
    for (let bi = lo; bi < blocks.length; bi++) {
      if (moversOnly && this.movers[bi] === 0) continue
      const block = blocks[bi] as Slot[]
      let i = 0
      if (bi === lo) {
        let l = 0
        let h = block.length
        while (l < h) {
          const mid = (l + h) >>> 1
          if (below(block[mid] as Slot)) l = mid + 1
          else h = mid
        }
        i = l
      }
      for (; i < block.length; i++) yield block[i] as Slot
    }
  }

  /** Every slot in order (with `moversOnly`, as `from`). */
  all(moversOnly = false): Generator<Slot> {
    return this.from(Number.NEGATIVE_INFINITY, Number.NEGATIVE_INFINITY, moversOnly)
  }
}

/** The key a template is filed under: its size and name (a name holds no `/`). */
const templateKey = (t: HeldTemplate): string => `${t.memMib}/${t.vcpus}/${t.name}`

/** A placement index over candidates that change one at a time. */
export class Index {
  private readonly all = new Map<string, Candidate>()
  private readonly slotOf = new Map<string, { slot: Slot; list: Sorted | Candidate[] }>()
  /** Open, measured hosts whose free RAM is their RAM limit. */
  private readonly measured = new Sorted()
  /** Open, unmeasured hosts, in ranking order (judged one by one: they are a last resort). */
  private readonly unmeasured = new Sorted()
  /** Open, measured hosts whose RAM is not gated although measured (rare): judged one by one. */
  private readonly irregular: Candidate[] = []
  /** The slots of `measured` again, per template their host holds (by `templateKey`). */
  private readonly holders = new Map<string, Sorted>()

  #limits: Limits

  constructor(limits: Limits = defaults) {
    this.#limits = limits
  }

  /** The limits the index judges fits by. */
  get limits(): Limits {
    return this.#limits
  }

  /** Replaces the limits; every host is re-filed. */
  setLimits(limits: Limits): void {
    this.#limits = limits
    const hosts = [...this.all.values()]
    for (const c of hosts) this.remove(c.id)
    for (const c of hosts) this.upsert(c)
  }

  /** An index over these candidates (a later one of an id replaces an earlier), built in one sort. */
  static of(hosts: Iterable<Candidate>, limits: Limits = defaults): Index {
    const index = new Index(limits)
    const measured: Slot[] = []
    const unmeasured: Slot[] = []
    let repeated = false
    for (const c of hosts) {
      if (index.all.has(c.id)) repeated = true
      index.all.set(c.id, c)
      if (repeated) continue
      const slot = index.slotFor(c)
      if (slot === null) continue
      const list = index.listOf(c)
      if (list === index.measured) measured.push(slot)
      else if (list === index.unmeasured) unmeasured.push(slot)
      else index.irregular.push(c)
      index.slotOf.set(c.id, { slot, list })
    }
    // An id given twice: the last one counts, filed one by one.
    if (repeated) {
      const all = [...index.all.values()]
      const again = new Index(limits)
      for (const c of all) again.upsert(c)
      return again
    }
    index.measured.load(measured.sort(cmpSlot))
    index.unmeasured.load(unmeasured.sort(cmpSlot))
    const held = new Map<string, Slot[]>()
    for (const slot of measured)
      for (const key of Index.keysOf(slot.c)) {
        const list = held.get(key)
        if (list === undefined) held.set(key, [slot])
        else list.push(slot)
      }
    for (const [key, slots] of held) {
      const list = new Sorted()
      list.load(slots)
      index.holders.set(key, list)
    }
    return index
  }

  /** The slot of an open host; null for a host that takes no placement. */
  private slotFor(c: Candidate): Slot | null {
    if (!Placement.isOpen(c, this.#limits)) return null
    const h = c.headroom
    return {
      c,
      mib: Headroom.freeMib(h) ?? Number.POSITIVE_INFINITY,
      vcpus: Headroom.freeVcpus(h) ?? Number.POSITIVE_INFINITY,
      fitMib: Headroom.fitLimitMib(h),
      fitVcpus: Headroom.fitLimitVcpus(h),
      movesIn: Placement.acceptsMoves(c),
    }
  }

  /** Which list an open host is filed in. */
  private listOf(c: Candidate): Sorted | Candidate[] {
    if (!Placement.isMeasured(c)) return this.unmeasured
    // The ranking key's RAM (freeMib, null = Infinity) equals the RAM fit limit here, so a
    // binary search on it finds the first host with enough RAM.
    if (Headroom.gatesRam(c.headroom) || c.headroom.allocatableMib === null) return this.measured
    return this.irregular
  }

  /** The distinct template keys a host holds. */
  private static keysOf(c: Candidate): ReadonlySet<string> {
    return new Set((c.templates ?? []).map(templateKey))
  }

  /** Adds or replaces a host. */
  upsert(c: Candidate): void {
    this.remove(c.id)
    this.all.set(c.id, c)
    const slot = this.slotFor(c)
    if (slot === null) return
    const list = this.listOf(c)
    if (Array.isArray(list)) list.push(c)
    else list.insert(slot)
    if (c.templates !== undefined && c.templates.length > 0 && list === this.measured)
      for (const key of Index.keysOf(c)) {
        let held = this.holders.get(key)
        if (held === undefined) this.holders.set(key, (held = new Sorted()))
        held.insert(slot)
      }
    this.slotOf.set(c.id, { slot, list })
  }

  /** Removes a host; unknown ids are ignored. */
  remove(id: string): void {
    const at = this.slotOf.get(id)
    if (at !== undefined) {
      if (Array.isArray(at.list)) at.list.splice(at.list.indexOf(at.slot.c), 1)
      else at.list.remove(at.slot)
      const held = at.slot.c.templates
      if (held !== undefined && held.length > 0 && at.list === this.measured)
        for (const key of Index.keysOf(at.slot.c)) {
          const list = this.holders.get(key)
          list?.remove(at.slot)
          if (list?.size === 0) this.holders.delete(key)
        }
      this.slotOf.delete(id)
    }
    this.all.delete(id)
  }

  get(id: string): Candidate | undefined {
    return this.all.get(id)
  }

  get size(): number {
    return this.all.size
  }

  values(): IterableIterator<Candidate> {
    return this.all.values()
  }

  /** The best host for the request, exactly as `Placement.pick` over every host here. */
  pick(req: Request): string | null {
    const b = req.budget
    const affinity = Placement.affinityIndexOf(req)
    // Measured affinity hosts rank above every other measured host, in preference order.
    for (const id of affinity.keys()) {
      const c = this.all.get(id)
      if (c !== undefined && Placement.admits(c, req, this.#limits) && Placement.isMeasured(c) && Placement.fitsOn(c, b, this.#limits)) return c.id
    }
    // Then, among the hosts that fit: the holders of the wanted template, then (with a spread)
    // the replica's own share, then best fit; each preference falls back to the next.
    const spread = req.spread === undefined || req.spread.replicas <= 1 ? undefined : req.spread
    const wanted = Placement.wantedTemplate(req)
    const inOrder = (list: Sorted | undefined, only?: (c: Candidate) => boolean): Candidate | undefined =>
      list === undefined
        ? undefined
        : (this.firstFit(list, req, affinity, spread, only) ?? (spread === undefined ? undefined : this.firstFit(list, req, affinity, undefined, only)))
    let best = wanted === undefined ? undefined : inOrder(this.holders.get(templateKey(wanted)))
    best ??= inOrder(this.measured)
    for (const c of this.irregular) {
      if (Placement.admits(c, req, this.#limits) && Placement.fitsOn(c, b, this.#limits) && (best === undefined || Placement.compare(c, best, affinity, wanted, spread) < 0)) best = c
    }
    if (best !== undefined) return best.id
    for (const id of affinity.keys()) {
      const c = this.all.get(id)
      if (c !== undefined && Placement.admits(c, req, this.#limits) && Placement.fitsOn(c, b, this.#limits)) return c.id
    }
    // The unmeasured hosts in the same order; their holders are not filed apart (rarely asked).
    const holder = (c: Candidate): boolean => Placement.holdsTemplate(c, wanted)
    return ((wanted === undefined ? undefined : inOrder(this.unmeasured, holder)) ?? inOrder(this.unmeasured))?.id ?? null
  }

  /** The host choice (`Placement.choose`) over the hosts here, picking through the index. */
  choose(req: Choice): Chosen {
    return Placement.chooseWith(req, (id) => this.all.get(id), (r) => this.pick(r), this.#limits)
  }

  /** Whether anything here fits the budget (with `now`: on a host not silent then, `Placement.isSilent`). */
  anyFits(budget: Budget, now?: number): boolean {
    return this.pick({ budget, now }) !== null
  }

  // The first slot whose RAM and CPU fit and that the request admits (`Placement.admits`: not the excluded host; one
  // that takes moves, when asked), in the spread's own share, with one; of the hosts `only` accepts, with it; affinity
  // hosts were judged already. Lists sorted by RAM limit (the measured hosts, a template's holders) are walked from the
  // budget's RAM; unmeasured ones are all walked.
  private firstFit(
    list: Sorted,
    req: Request,
    affinity: ReadonlyMap<string, number>,
    spread?: Placement.Spread,
    only?: (c: Candidate) => boolean,
  ): Candidate | undefined {
    const b = req.budget
    // A move without a named target passes the blocks of hosts that take no moves at once.
    const moversOnly = req.takesMovesOnly === true
    for (const s of list === this.unmeasured ? list.all(moversOnly) : list.from(b.memMib, Number.NEGATIVE_INFINITY, moversOnly)) {
      if (
        s.fitMib >= b.memMib &&
        s.fitVcpus >= b.vcpus &&
        !affinity.has(s.c.id) &&
        Placement.admits(s.c, req, this.#limits) &&
        (spread === undefined || Placement.isOwn(spread, s.c.id)) &&
        (only === undefined || only(s.c))
      )
        return s.c
    }
    return undefined
  }
}
