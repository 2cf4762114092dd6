// The coordinator's wall clock jumps, backward and forward, under a load of creates and ends and
// hosts heartbeating as agents do. The coordinator runs in this process (its clock is Effect's
// `Clock`; there is no test-only way to offset a coordinator process's clock, and adding one to
// the production entry point would be a hook no operator needs) with a jumpable clock provided to
// its layer, on PostgreSQL; reaper passes are run by hand so each is one step of the test.
// On PostgreSQL the store keeps the database's time (store-pg's `databaseTime`: the monotonic
// clock plus an offset from the database's clock), so no jump of the replica's wall clock moves
// a time the store stamps or judges:
// - a backward jump (1 h): sessions created after it are stamped at the database's now, not an
//   hour back; nothing is stale, no session is lost;
// - a forward jump (10 min, beyond the 2 min stale window) while the hosts' heartbeats are held
//   (for seconds): nothing is stale, no session is lost (before the store kept the database's
//   time, every reservation not heartbeated since was reclaimed here and its session lost);
// - back to the real time with heartbeats flowing: still nothing lost.
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

/**
 * The creates acknowledged after `afterMs` whose session's `created_at` is not within its own
 * request's time (sent − 5 s, answered + 5 s; the database runs on this machine, so its clock is
 * this process's): each as [id, created_at, sent, answered]. Empty when every stamp is the
 * database's time, whatever the coordinator's wall clock said. Also how many were looked at.
 */
const stampsOutside = async (recorder: History.Recorder, afterMs: number) => {
  const creates = recorder.ops.filter((o) => o.kind === "create" && o.startMs > afterMs && History.acknowledged(o) && o.id !== null)
  const rows = await sql<{ id: string; created_at: string }[]>`select id, created_at from sessions where id = any(${creates.map((o) => o.id!)})`
  const stamped = new Map(rows.map((r) => [r.id, Number(r.created_at)]))
  const outside = creates
    .filter((o) => stamped.has(o.id!))
    .map((o) => [o.id!, stamped.get(o.id!)!, o.startMs, o.endMs] as const)
    .filter(([, at, sent, answered]) => at < sent - 5_000 || at > answered + 5_000)
  return { looked: creates.filter((o) => stamped.has(o.id!)).length, outside }
}

describe("a clock jump of a coordinator on PostgreSQL", () => {
  it("moves no time the store stamps or judges: back an hour, ten minutes ahead with heartbeats held, back again: stamps at the database's time, nothing stale, nothing lost; the history checks out", async () => {
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

      // Backward by an hour: the sessions created after it are stamped at the database's time.
      jump.jump(-HOUR)
      const back = Date.now()
      await Load.until("creates after the backward jump", () => acksAfter(back) >= 10)
      for (let i = 0; i < 3; i++) await pass()
      expect(await lostIds()).toEqual(new Set())
      // Each stamped within its own request's time, not an hour back.
      const stampedBack = await stampsOutside(recorder, back)
      expect(stampedBack.looked).toBeGreaterThan(0)
      expect(stampedBack.outside).toEqual([])

      // Forward to 10 minutes ahead of the real time with heartbeats held: on the replica's own
      // clock every reservation would be stale beyond the 2 min window; on the database's it is
      // seconds old.
      holding = true
      await beat
      await load.stop()
      jump.jump(HOUR + 10 * MINUTE)
      for (let i = 0; i < 3; i++) await pass()
      expect(await lostIds()).toEqual(new Set())
      holding = false
      load = Load.startLoad(recorder, { prefix: "clock-ahead", workers: 3, memMib: 512, endEvery: 3 })
      const ahead = Date.now()
      await Load.until("creates after the forward jump", () => acksAfter(ahead) >= 10)
      const stampedAhead = await stampsOutside(recorder, ahead)
      expect(stampedAhead.looked).toBeGreaterThan(0)
      expect(stampedAhead.outside).toEqual([])

      // Back to the real time, heartbeats flowing: still nothing lost.
      jump.jump(-10 * MINUTE)
      const home = Date.now()
      await Load.until("creates after the clock came back", () => acksAfter(home) >= 10)
      for (let i = 0; i < 3; i++) await pass()
      expect(await lostIds()).toEqual(new Set())

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
