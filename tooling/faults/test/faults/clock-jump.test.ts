// The coordinator's wall clock jumps, backward and forward, under a load of creates and ends and
// hosts heartbeating as agents do. The coordinator runs in this process (its clock is Effect's
// `Clock`; there is no test-only way to offset a coordinator process's clock, and adding one to
// the production entry point would be a hook no operator needs) with a jumpable clock provided to
// its layer, on PostgreSQL; reaper passes are run by hand so each is one step of the test.
// - a backward jump (1 h): heartbeats land "in the past" of earlier ones; nothing becomes stale
//   (a heartbeat in the future is clock skew, SPEC §3) and no session is lost;
// - a forward jump (10 min, beyond the 2 min stale window) while the hosts' heartbeats are held:
//   every reservation not heartbeated since is reclaimed and its session is `lost` (SPEC §3);
// - back to the real time (a backward jump of 10 min) with heartbeats flowing: no more losses.
// After it, the checker over the whole history.
import { Coordinator, CoordinatorInfo, Leader, reaperPass } from "@engram/coordinator"
import { freshDatabase, type TestDatabase } from "@engram/test-pg"
import { Context, Effect, Exit, Layer, Option, Scope } from "effect"
import postgres from "@engram/postgres"
import { setTimeout as delay } from "node:timers/promises"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { History, JumpClock, Load, Observe } from "../../src/index.js"
import { tempDir, killAll } from "../../src/Processes.js"
import { ADMIN_TOKEN, capacities, expectNoViolations, registerHosts } from "./fixture.js"

const HOUR = 3_600_000
const MINUTE = 60_000

let db: TestDatabase
let sql: postgres.Sql
const jump = JumpClock.make()
const scope = Effect.runSync(Scope.make())
let url: string
let pass: () => Promise<unknown>

beforeAll(async () => {
  db = await freshDatabase({ prefix: "faults_clock" })
  sql = postgres(db.url, { max: 1, onnotice: () => undefined })
  // The store's stale rule under clock jumps, without the failover grace (which a clock step
  // restarts; apps/coordinator/test/grace.test.ts has its own tests).
  const built = Coordinator.layer({ reaper: false, config: { port: 0, adminToken: ADMIN_TOKEN, databaseUrl: db.url, dataDir: tempDir("clock"), reclaimGraceMs: 0 } }).pipe(
    Layer.provide(Coordinator.loggerLayer("Error")),
    Layer.provide(jump.layer),
  )
  const context = await Effect.runPromise(Layer.buildWithScope(built, scope))
  url = Context.get(context, CoordinatorInfo).url
  // As the loop does each interval: take (or keep) the leader lock, then one pass.
  const tick = Effect.flatMap(Effect.serviceOption(Leader), (l) => (Option.isSome(l) ? l.value.tick : Effect.void))
  pass = () =>
    Effect.runPromise(Effect.andThen(tick, reaperPass).pipe(Effect.provideContext(context), Effect.provide(jump.layer), Effect.provide(Coordinator.loggerLayer("Error"))))
})

afterAll(async () => {
  await Effect.runPromise(Scope.close(scope, Exit.void))
  await sql?.end({ timeout: 5 })
  await db?.drop()
  await killAll()
})

const lostIds = async () => new Set((await sql<{ id: string }[]>`select id from sessions where state = 'lost'`).map((r) => r.id))

describe("a clock jump", () => {
  it("backward: nothing is stale, nothing lost; forward beyond the stale window with heartbeats held: those reservations reclaimed, their sessions lost; back again: no more losses; the history checks out", async () => {
    const tokens = await registerHosts(url, "clock-host", 2, 4096)
    const caps = await capacities(url)
    const recorder = new History.Recorder(url, ADMIN_TOKEN)
    const observer = Observe.sqlObserver(db.url, caps)
    const sampler = Observe.startSampler(observer.sample)
    // The hosts heartbeat their reservations as agents do, unless held.
    let holding = false
    let stopping = false
    let beat = Promise.resolve()
    const heartbeater = (async () => {
      while (!stopping) {
        if (!holding) {
          beat = Promise.all([...tokens.keys()].map((id) => recorder.call("other", id, "POST", `/v1/hosts/${id}/heartbeat`))).then(() => undefined)
          await beat
        }
        await delay(100)
      }
    })()
    let load = Load.startLoad(recorder, { prefix: "clock", workers: 3, memMib: 512, endEvery: 3 })
    const acksAfter = (t: number) => recorder.ops.filter((o) => o.kind === "create" && o.startMs > t && History.acknowledged(o)).length
    try {
      await Load.until("the first acknowledged creates", () => acksAfter(0) >= 20)

      // Backward by an hour: timestamps go back with it; nothing is stale, nothing lost.
      jump.jump(-HOUR)
      const back = Date.now()
      await Load.until("creates after the backward jump", () => acksAfter(back) >= 10)
      for (let i = 0; i < 3; i++) await pass()
      expect(await lostIds()).toEqual(new Set())
      const [newest] = await sql<{ created_at: string }[]>`select created_at from sessions order by created_at asc limit 1`
      expect(Number(newest?.created_at)).toBeLessThan(Date.now() - HOUR / 2)

      // Forward to 10 minutes ahead of the real time with heartbeats held: stale beyond the 2 min
      // window. The load pauses over the jump so that no create straddles it (one that read the
      // time before the jump and commits after the pass would be left for the next pass).
      holding = true
      await beat
      await load.stop()
      jump.jump(HOUR + 10 * MINUTE)
      await pass()
      const lostForward = await lostIds()
      expect(lostForward.size).toBeGreaterThan(0)
      // What the pass read as stale is gone: no reservation last heartbeated before the window.
      const cutoff = Date.now() + jump.offsetMs() - 2 * MINUTE - 5_000
      expect(await sql`select id, last_heartbeat_at from reservations where last_heartbeat_at < ${cutoff}`).toEqual([])
      holding = false
      load = Load.startLoad(recorder, { prefix: "clock-ahead", workers: 3, memMib: 512, endEvery: 3 })

      // Back to the real time: everything heartbeated since is "in the future", never stale.
      jump.jump(-10 * MINUTE)
      const home = Date.now()
      await Load.until("creates after the clock came back", () => acksAfter(home) >= 10)
      for (let i = 0; i < 3; i++) await pass()
      const lostAfter = await lostIds()
      expect([...lostAfter].filter((id) => !lostForward.has(id))).toEqual([])

      await load.stop()
      stopping = true
      await heartbeater
      await sampler.stop()
      expect(recorder.ops.filter((o) => o.status === null || o.status >= 500)).toEqual([])
      expectNoViolations(recorder.ops, { ...(await observer.observe()), samples: sampler.samples })
    } finally {
      stopping = true
      await load.stop()
      await heartbeater
      await sampler.stop()
      await observer.close()
    }
  })
})
