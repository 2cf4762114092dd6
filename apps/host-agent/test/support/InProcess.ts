/**
 * Two (or more) agents in one process with in-memory links and a fake coordinator: the
 * clock-driven fixture. Agents are built without their loops; tests drive reconcile passes, and
 * may restart an agent (`restart`: stopped, then started again from its state file).
 * The runtimes are `@engram/runtime`'s simulated ones on its in-memory wire.
 */
import { mkdtempSync } from "node:fs"
import { cp, readdir, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { Move as CoreMove } from "@engram/core"
import { ImageStore, type Launch, type MigrateResult, type MoveRound, RuntimeError, SimRuntime, type VmRuntimeShape } from "@engram/runtime"
import { Effect, Exit, Ref, Scope } from "effect"
import { TestClock } from "effect/testing"
import { type Agent, makeAgent } from "../../src/Agent.js"
import type { CoordinatorShape } from "../../src/Coordinator.js"
import { defaultAgentConfig } from "../../src/Host.js"
import * as ImageFetch from "../../src/ImageFetch.js"
import * as LocalState from "../../src/LocalState.js"
import { makeMoveTarget, type MoveTarget } from "../../src/MoveTarget.js"
import * as PeerLink from "../../src/PeerLink.js"
import { makeResidents, type Residents } from "../../src/Residents.js"
import { makeFakeCoordinator, type FakeCoordinator } from "./FakeCoordinator.js"

export interface TestHost {
  readonly hostId: string
  readonly agent: Agent
  readonly runtime: SimRuntime.SimRuntimeShape & { readonly starts: Ref.Ref<number>; readonly launches: Ref.Ref<readonly Launch[]> }
  readonly residents: Residents
  readonly target: MoveTarget
  readonly images: ImageStore.ImageStore
}

/**
 * Wraps a runtime to count starts (a guest booted again lost its memory) and keep how each VM
 * came to run, to run `onPause` when
 * a move has paused the guest at its post-capture check point (nothing sent yet), and
 * `onSwitchover` just before the final round is sent (`onSent` once it is), and `onBeforePause` when the guard decided
 * to pause, the guest still running, before the caller's `beforePause` (its intent). `late`:
 * pre-copy rounds it reports only at the pause (`unreported`). `sendFails`: how many of its moves'
 * final rounds fail to send (the first ones: the stream breaks mid-send, the pause given back as
 * the runtime does): the target holds no complete stream.
 */
const counting = (
  rt: SimRuntime.SimRuntimeShape,
  onPause: (vmId: string) => Effect.Effect<void>,
  onSwitchover: (vmId: string) => Effect.Effect<void>,
  onBeforePause: (vmId: string) => Effect.Effect<void>,
  selfConverge: boolean,
  intentFirst: ((vmId: string) => Effect.Effect<void>) | undefined,
  onSent: (vmId: string) => Effect.Effect<void>,
  late: readonly MoveRound[],
  onDescend: (vmId: string) => Effect.Effect<void>,
  sendFails: number,
) =>
  Effect.gen(function* () {
    const starts = yield* Ref.make(0)
    const launches = yield* Ref.make<readonly Launch[]>([])
    let failsLeft = sendFails
    const broken = (vmId: string, r: MigrateResult): MigrateResult =>
      r._tag !== "AtSwitchover" || sendFails === 0
        ? r
        : {
            ...r,
            switchover: Effect.suspend(() =>
              failsLeft-- > 0 ? Effect.andThen(r.abort, Effect.fail(new RuntimeError({ op: "switchover", vmId, message: "the link to the target dropped during the final round; the pause was given back" }))) : r.switchover,
            ),
          }
    const migrate: VmRuntimeShape["migrate"] = (vmId, req) =>
      intentFirst !== undefined
        ? Effect.andThen(Effect.andThen(req.beforePause ?? Effect.void, intentFirst(vmId)), rt.migrate(vmId, { ...req, beforePause: undefined })).pipe(
            Effect.tap((r: MigrateResult) => (r._tag === "AtSwitchover" ? onPause(vmId) : Effect.void)),
            Effect.map((r) => broken(vmId, r)),
          )
        : // `selfConverge`: as a hypervisor that paused on its own before the guard decided (QEMU converging by itself): `beforePause` is never called.
      rt.migrate(vmId, { ...req, beforePause: selfConverge ? undefined : Effect.andThen(onBeforePause(vmId), req.beforePause ?? Effect.void) }).pipe(
        Effect.tap((r: MigrateResult) => (r._tag === "AtSwitchover" ? onPause(vmId) : Effect.void)),
        Effect.map((r): MigrateResult =>
          r._tag === "AtSwitchover"
            ? {
                ...r,
                rounds: [...r.rounds, ...late],
                unreported: [...r.unreported, ...late],
                selfConverged: selfConverge,
                switchover: Effect.andThen(onSwitchover(vmId), r.switchover).pipe(Effect.tap(() => onSent(vmId))),
              }
            : r,
        ),
        Effect.map((r) => broken(vmId, r)),
      )
    return {
      ...rt,
      starts,
      launches,
      migrate,
      descend: (vmId: string, path: string) => Effect.andThen(onDescend(vmId), rt.descend(vmId, path)),
      start: (...args: Parameters<VmRuntimeShape["start"]>) =>
        Ref.update(starts, (n) => n + 1).pipe(
          Effect.andThen(rt.start(...args)),
          Effect.tap((v) => Ref.update(launches, (l) => [...l, v.launch])),
        ),
    }
  })

export interface FleetOptions {
  /** Runs on a host when a move paused a VM there (e.g. the coordinator acting meanwhile). */
  readonly onPause?: (coordinator: FakeCoordinator, hostId: string, vmId: string) => Effect.Effect<void>
  /** Runs on a host when a move's guard decided to pause a VM there, the guest still running, before the agent records its intent. */
  readonly onBeforePause?: (coordinator: FakeCoordinator, hostId: string, vmId: string) => Effect.Effect<void>
  /** The runtime pauses on its own before its guard decides (as QEMU may): it never calls the agent's `beforePause`. */
  readonly selfConverge?: boolean
  /**
   * As QEMU: the caller's `beforePause` (its intent) is taken before the first round, then this
   * hook runs (the guest running, the intent held); the simulated migration follows.
   */
  readonly intentFirst?: (coordinator: FakeCoordinator, hostId: string, vmId: string) => Effect.Effect<void>
  /** Runs on a host just before a move's final round leaves it. */
  readonly onSwitchover?: (coordinator: FakeCoordinator, hostId: string, vmId: string) => Effect.Effect<void>
  /** Runs on a host once a move's final round was sent, before its agent learns it. */
  readonly onSent?: (coordinator: FakeCoordinator, hostId: string, vmId: string) => Effect.Effect<void>
  /**
   * Pre-copy rounds a host's runtime reports only at the pause (`AtSwitchover.unreported`, as
   * QEMU's passes read after the fact), after the simulated ones.
   */
  readonly lateRounds?: (hostId: string) => readonly MoveRound[]
  /** Runs on a host when its agent descends a VM there, before the runtime captures it (e.g. the VM crashing meanwhile). */
  readonly onDescend?: (coordinator: FakeCoordinator, hostId: string, vmId: string) => Effect.Effect<void>
  /** How many of a host's moves' final rounds fail to send (the first ones; the runtime gives the pause back). */
  readonly sendFails?: (hostId: string) => number
  /** Wraps a host's coordinator client (e.g. to hold one of its calls). */
  readonly wrapCoordinator?: (client: CoordinatorShape, hostId: string) => CoordinatorShape
  /** Wraps a host's image store (e.g. to refuse its removals, as a disk that fails them). */
  readonly wrapImages?: (images: ImageStore.ImageStore, hostId: string) => ImageStore.ImageStore
  /**
   * Whether an agent fetches a descent image from the host the coordinator names as holding it,
   * copying that host's session directory into its own store (in place of the peers' HTTP fetch);
   * default off (a resume placed elsewhere boots fresh).
   */
  readonly fetchImages?: boolean
  /** Wraps the in-memory peer link (e.g. to watch it, or cut it). */
  readonly wrapLink?: (link: PeerLink.PeerLink, coordinator: FakeCoordinator) => PeerLink.PeerLink
  /** Runs on each write of a host's state file (e.g. to count them). */
  readonly onPersist?: (hostId: string) => Effect.Effect<void, LocalState.StateWriteError>
  /** The agents' `moveIntent` (`ENGRAM_AGENT_MOVE_INTENT`); these in-process tests default to on. */
  readonly moveIntent?: boolean
  /** Whether the agents hash their descent images for their listing (`ImageFetch.warmHashes`), as an agent serving peers does; default off. */
  readonly warmImages?: boolean
  /** In place of `warmImages`' hashing: what a host's agent runs to hash a descent image (e.g. to keep its `goOn`). */
  readonly warmImage?: (hostId: string, sessionId: string, goOn: Effect.Effect<boolean>) => Effect.Effect<{ readonly files: number; readonly bytes: number; readonly stopped: boolean }>
}

/**
 * A fetch of `sessionId`'s image from `from` (the image host's store) into `into`: its session
 * directory copied over whatever `into` holds under the id, as the HTTP fetch moves a complete
 * staging into place. No image there: the image host's word that it has none (`absent`).
 */
const copyImage = (from: ImageStore.ImageStore | undefined, into: ImageStore.ImageStore, sessionId: string, imageHostId: string) =>
  Effect.gen(function* () {
    const image = from === undefined ? undefined : yield* from.get(sessionId)
    if (from === undefined || image === undefined) return yield* Effect.fail(new ImageFetch.ImageFetchError({ sessionId, imageHostId, message: ImageFetch.noImageMessage(sessionId), absent: true }))
    const target = dirname(into.pathFor(sessionId))
    yield* Effect.promise(async () => {
      await rm(target, { recursive: true, force: true })
      await cp(dirname(from.pathFor(sessionId)), target, { recursive: true })
    })
    const files = yield* Effect.promise(() => readdir(target))
    return { files: files.length, bytes: image.bytes }
  })

export const makeFleet = (hosts: readonly { readonly hostId: string; readonly sim?: Partial<SimRuntime.SimConfig> }[], options: FleetOptions = {}) =>
  Effect.gen(function* () {
    const coordinator: FakeCoordinator = yield* makeFakeCoordinator
    const targets = new Map<string, MoveTarget>()
    const plain = PeerLink.inMemory(targets)
    const link = options.wrapLink === undefined ? plain : options.wrapLink(plain, coordinator)
    const built: TestHost[] = []
    /** Each host's image store (unwrapped): where a fetch copies an image from. */
    const stores = new Map<string, ImageStore.ImageStore>()
    /** The fetches tried (`fetchImages`), in order: `<host> <- <image host>: <session>`. */
    const fetches = yield* Ref.make<readonly string[]>([])
    const outer = yield* Effect.scope
    /** Each host's agent lives in a scope of its own: closing it is the agent stopping (`restart`). */
    const stops = new Map<string, Effect.Effect<void>>()
    /** Builds a host's agent (and its move target) on `runtime`, from `state` (null: a new host). */
    const startAgent = (hostId: string, runtime: TestHost["runtime"], state: LocalState.StateFile | null) =>
      Effect.gen(function* () {
        const scope = yield* Scope.fork(outer)
        const residents = yield* makeResidents(hostId, state, () => (options.onPersist === undefined ? Effect.void : options.onPersist(hostId)))
        const target = yield* makeMoveTarget(hostId, runtime, residents)
        targets.set(hostId, target)
        const client = coordinator.client(hostId)
        const store = ImageStore.directory(mkdtempSync(join(tmpdir(), `engram-images-${hostId}-`)))
        const images = options.wrapImages === undefined ? store : options.wrapImages(store, hostId)
        stores.set(hostId, store)
        const agent = yield* makeAgent({ ...defaultAgentConfig(hostId), moveIntent: options.moveIntent ?? true }, {
          coordinator: options.wrapCoordinator === undefined ? client : options.wrapCoordinator(client, hostId),
          runtime,
          measure: () => Effect.succeed({ totalMib: 16384, allocatableMib: 15360, totalVcpus: 8 }),
          residents,
          images,
          link,
          target,
          ...(options.fetchImages === true ? { fetchImage: (sessionId: string, imageHostId: string) => Effect.andThen(Ref.update(fetches, (f) => [...f, `${hostId} <- ${imageHostId}: ${sessionId}`]), copyImage(stores.get(imageHostId), store, sessionId, imageHostId)) } : {}),
          ...(options.warmImages === true ? { warmImage: (sessionId: string, goOn: Effect.Effect<boolean>) => ImageFetch.warmHashes(images, sessionId, goOn) } : {}),
          ...(options.warmImage === undefined ? {} : { warmImage: (sessionId: string, goOn: Effect.Effect<boolean>) => options.warmImage!(hostId, sessionId, goOn) }),
        }).pipe(Scope.provide(scope))
        stops.set(hostId, Scope.close(scope, Exit.void))
        return { hostId, agent, runtime, residents, target, images } satisfies TestHost
      })
    for (const h of hosts) {
      const hook = (f: FleetOptions["onPause"]) => (vmId: string) => (f === undefined ? Effect.void : f(coordinator, h.hostId, vmId))
      const runtime = yield* counting(
        yield* SimRuntime.make(h.sim),
        hook(options.onPause),
        hook(options.onSwitchover),
        hook(options.onBeforePause),
        options.selfConverge === true,
        options.intentFirst === undefined ? undefined : hook(options.intentFirst),
        hook(options.onSent),
        options.lateRounds?.(h.hostId) ?? [],
        hook(options.onDescend),
        options.sendFails?.(h.hostId) ?? 0,
      )
      built.push(yield* startAgent(h.hostId, runtime, null))
    }
    /**
     * Stops a host's agent (its scope closes: what it was doing is interrupted, as when its
     * process is killed) and starts it again on the same runtime (the VMs outlive the agent)
     * from its state file as last written (saved and loaded back as the agent's start does).
     * The new host replaces the old one in `hosts`.
     */
    const restart = (hostId: string) =>
      Effect.gen(function* () {
        const i = built.findIndex((h) => h.hostId === hostId)
        const old = built[i]!
        yield* stops.get(hostId)!
        const last = yield* old.residents.snapshot
        const path = join(mkdtempSync(join(tmpdir(), `engram-restart-${hostId}-`)), "state.json")
        yield* LocalState.save(path, last)
        const loaded = yield* LocalState.load(path, hostId).pipe(Effect.orDie)
        if (loaded._tag !== "Loaded") return yield* Effect.die(new Error(`the state file of ${hostId} did not load back: ${loaded._tag}`))
        const fresh = yield* startAgent(hostId, old.runtime, loaded.state)
        built[i] = fresh
        return fresh
      })
    /** One reconcile pass on every host from the coordinator's current view. */
    const pass = Effect.gen(function* () {
      for (const h of built) yield* h.agent.reconcile(yield* coordinator.assignmentsOf(h.hostId))
    })
    /**
     * Lets every host's actions finish on the TestClock: the clock moves a minute, then in
     * steps of a second while an action is still in flight (a descent or a restore does real
     * file I/O between its simulated durations, which the test clock cannot wait for). Bounded
     * in steps and in real time: the first steps give the I/O one turn of the event loop each,
     * the later ones 10 ms of real time, so a loaded machine's slow file I/O (a CI run at load 32
     * outlasted 2,000 turns) still finishes inside the bound, about 20 s.
     */
    const quiesce = Effect.gen(function* () {
      yield* TestClock.adjust("1 minute")
      for (let i = 0; i < 2000; i++) {
        let busy = false
        let acting = false
        for (const h of built) {
          busy = (yield* h.agent.busy) || busy
          acting = (yield* h.agent.acting) || acting
        }
        if (!busy) return
        // The file I/O's turn (real time), then the clock for what follows it: only while an action
        // runs (the image scan beside the reconcile is file I/O alone; moving the clock while a
        // loaded machine's scan ran made the agents' heartbeats look older than the stale window).
        yield* Effect.promise(() => new Promise<void>((resolve) => (i < 100 ? setImmediate(resolve) : setTimeout(resolve, 10))))
        if (acting) yield* TestClock.adjust("1 second")
      }
      return yield* Effect.die(new Error("the agents' actions did not finish"))
    })
    /** `passes` coordinator passes, each followed by the agents' actions (`quiesce`): the fleet settled. */
    const settle = (passes = 4) =>
      Effect.gen(function* () {
        for (let i = 0; i < passes; i++) {
          yield* pass
          yield* quiesce
        }
      })
    return { coordinator, hosts: built, pass, quiesce, settle, restart, fetches }
  })

/**
 * An `intentFirst` for the move tests (`moveBegunAToB`'s m1 of s1 from a to b): as QEMU, the
 * intent is taken before the first round; then an operator commits the move (as the store's
 * resolve: a commit without phases needs only the point of no return, `refuseCommit(m, false)`),
 * the session placed on b. `committedAt` holds the kinds of the rounds recorded when the commit
 * landed (null: it did not).
 */
export const operatorCommitsAtIntent = () => {
  const seen: { committedAt: readonly string[] | null } = { committedAt: null }
  const intentFirst = (coordinator: FakeCoordinator, hostId: string) =>
    hostId !== "a"
      ? Effect.void
      : Ref.update(coordinator.ref, (s) => {
          const m = s.moves.get("m1")!
          if (CoreMove.refuseCommit(m, false) !== null) return s
          seen.committedAt = m.rounds.map((r) => r.kind)
          return {
            ...s,
            moves: new Map(s.moves).set("m1", { ...m, state: "committed" }),
            sessions: new Map(s.sessions).set("s1", { ...s.sessions.get("s1")!, state: "running", hostId: "b", reservationId: "res-move-m1" }),
          }
        })
  return { seen, intentFirst }
}

/** The VMs each of two hosts runs (id and status), read now: where a session's copies are. */
export const copiesOn = (a: TestHost, b: TestHost) =>
  Effect.gen(function* () {
    return { a: (yield* a.runtime.list).map((v) => [v.vmId, v.status]), b: (yield* b.runtime.list).map((v) => [v.vmId, v.status]) }
  })

/**
 * The move tests' start: on `fleet`'s two hosts a and b, session s1 (4 GiB, 2 vCPUs) runs on a,
 * move m1 to b (a 600 ms budget) is begun and one pass runs (the source's move under way, or
 * ended by what the test's options did to it). Answers the hosts and `copiesOn` them.
 */
export const moveBegunAToB = (fleet: Effect.Success<ReturnType<typeof makeFleet>>) =>
  Effect.gen(function* () {
    const [a, b] = fleet.hosts as [TestHost, TestHost]
    yield* fleet.coordinator.addSession("s1", "a", 4096, 2)
    yield* fleet.settle()
    yield* fleet.coordinator.beginMove("m1", "s1", "b", 600)
    yield* fleet.settle(1)
    return { a, b, copies: copiesOn(a, b) }
  })
