/**
 * runtime-qemu bench, on real guests (TCG here): how long an unpark takes (QMP `cont`, and
 * `stop`+`cont` as the park cycle), and how well the downtime guard's estimates predict the
 * pause of QEMU's live migration for guests dirtying memory at several rates, over a fast link
 * (1 GiB/s: QEMU converges by itself) and a slow one (32 MiB/s: engram decides). Every move goes
 * A → B → A …; for each committed one the pre-pause estimate (over the rounds before the
 * pause, with the guard's own inputs) and the post-capture estimate (at pre-switchover) are
 * compared with engram's measured downtime (pause → running on the target) and QEMU's own
 * `downtime`. A second, tight budget counts verdicts and any committed move over its budget
 * beyond the documented commit tail (commit slower than its allowance).
 *
 * `pnpm --filter @engram/runtime-qemu bench`; ENGRAM_BENCH_MOVES (default 3) moves per rate and link.
 */
import { appendFileSync, mkdtempSync, readFileSync } from "node:fs"
import { dirname } from "node:path"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { report, resultsFile } from "@engram/bench"
import { cmdline, ensureGuest, ticks } from "@engram/guest"
import { Move, MoveGuard, type MoveBudget, type VmSpec } from "@engram/runtime"
import { Effect, Exit, Schedule, Scope } from "effect"
import { QemuRuntime, type QemuRuntimeShape } from "../src/index.js"

const MOVES = Number(process.env["ENGRAM_BENCH_MOVES"] ?? 3)
const rates = [
  { name: "idle", dirtyKibPerSec: 0, hotMib: 4 },
  { name: "4 MiB/s", dirtyKibPerSec: 4 * 1024, hotMib: 16 },
  { name: "16 MiB/s", dirtyKibPerSec: 16 * 1024, hotMib: 16 },
  { name: "48 MiB/s", dirtyKibPerSec: 48 * 1024, hotMib: 16 },
] as const
/** A QEMU-local commit (`cont` on the target) takes tens of ms: the allowance the accuracy runs use. */
const allowanceMs = 50
const loose: MoveBudget = { maxDowntimeMs: 2000, commitAllowanceMs: allowanceMs, maxPreCopyRounds: 8 }
const tight: MoveBudget = { maxDowntimeMs: 120, commitAllowanceMs: allowanceMs, maxPreCopyRounds: 8 }

const quantile = (xs: readonly number[], q: number) => {
  if (xs.length === 0) return Number.NaN
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))] as number
}

const awaitCounter = (rt: QemuRuntimeShape, vmId: string) =>
  Effect.suspend(() => {
    let text: string
    try {
      text = readFileSync(rt.consolePath(vmId), "utf8")
    } catch {
      text = ""
    }
    return ticks(text).length >= 2 ? Effect.void : Effect.fail(new Error(`${vmId} prints no counter`))
  }).pipe(Effect.retry({ schedule: Schedule.spaced("100 millis"), times: 1800 }))

const program = Effect.gen(function* () {
  const guest = yield* Effect.promise(() => ensureGuest({ log: (l) => console.log(l) }))
  const loadOf = (vmId: string) => rates.find((r) => vmId.startsWith(r.name.replace(/[^a-z0-9]/gi, ""))) ?? rates[0]
  const boot = (spec: VmSpec) => ({ kernel: guest.kernel, initrd: guest.initrd, append: cmdline(loadOf(spec.vmId)) })
  const pair = (bandwidth: number) =>
    Effect.all([0, 1].map(() => QemuRuntime.make({ stateDir: mkdtempSync(join(tmpdir(), "eq-bench-")), boot, moveBandwidthBytesPerSec: bandwidth })))
  const links = [
    { name: "1 GiB/s", runtimes: yield* pair(1024 ** 3) },
    { name: "32 MiB/s", runtimes: yield* pair(32 * 1024 ** 2) },
  ]
  const A = links[0]!.runtimes[0]!
  const info = yield* A.info
  console.log(`runtime: ${info.kind}, ${info.detail}`)

  // Unpark latency on an idle guest.
  const idle: VmSpec = { vmId: "idle-park", memMib: 128, vcpus: 1 }
  yield* A.start(idle)
  yield* awaitCounter(A, idle.vmId)
  const unparks: number[] = []
  const cycles: number[] = []
  for (let i = 0; i < 30; i++) {
    const t0 = performance.now()
    yield* A.park(idle.vmId)
    const t1 = performance.now()
    yield* A.unpark(idle.vmId)
    const t2 = performance.now()
    unparks.push(t2 - t1)
    cycles.push(t2 - t0)
  }
  yield* A.destroy(idle.vmId)
  report({ bench: "runtime-qemu", figure: "unpark (QMP cont) median, 30 runs", value: quantile(unparks, 0.5), unit: "ms", goal: "milliseconds" })
  report({ bench: "runtime-qemu", figure: "unpark (QMP cont) p95", value: quantile(unparks, 0.95), unit: "ms" })
  report({ bench: "runtime-qemu", figure: "park + unpark cycle median", value: quantile(cycles, 0.5), unit: "ms" })

  const table: string[] = []
  for (const link of links)
  for (const rate of rates) {
    const spec: VmSpec = { vmId: `${rate.name.replace(/[^a-z0-9]/gi, "")}-g`, memMib: 128, vcpus: 1 }
    let here = link.runtimes[0]!
    let there = link.runtimes[1]!
    yield* here.start(spec)
    yield* awaitCounter(here, spec.vmId)
    const pre: number[] = []
    const post: number[] = []
    const engramDown: number[] = []
    const qemuDown: number[] = []
    let selfConverged = 0
    let committed = 0
    let refused = 0
    let overBeyondTail = 0
    const run = (budget: MoveBudget, i: number) =>
      Effect.gen(function* () {
        const out = yield* Move.between(here, there, spec.vmId, { moveId: `${spec.vmId}-${i}`, budget })
        // Every move, for the README's analysis: .bench/runtime-qemu-moves.jsonl
        appendFileSync(join(dirname(resultsFile), "runtime-qemu-moves.jsonl"), `${JSON.stringify({ link: link.name, rate: rate.name, budget, out })}\n`)
        if (out._tag === "Committed") {
          ;[here, there] = [there, here]
          committed++
          const preEst = MoveGuard.prePauseEstimateMs(out.rounds.filter((r) => r.kind !== "final"), budget)
          const down = out.phases.downtimeMs
          if (budget === loose) {
            pre.push(preEst - down)
            post.push(out.estimateMs - down)
            engramDown.push(down)
            if (out.runtimeDowntimeMs !== null) qemuDown.push(out.runtimeDowntimeMs)
            if (out.selfConverged) selfConverged++
          }
          const tail = Math.max(0, out.phases.commitMs - budget.commitAllowanceMs)
          if (down > budget.maxDowntimeMs + tail) overBeyondTail++
        } else refused++
      })
    for (let i = 0; i < MOVES; i++) yield* run(loose, i)
    for (let i = 0; i < 2; i++) yield* run(tight, MOVES + i)
    yield* here.destroy(spec.vmId)
    const f = (x: number) => (Number.isFinite(x) ? x.toFixed(1) : "–")
    const row = `| ${link.name} | ${rate.name} | ${pre.length} | ${f(quantile(engramDown, 0.5))} / ${f(quantile(engramDown, 0.95))} | ${f(quantile(qemuDown, 0.5))} | ${f(quantile(pre, 0.5))} / ${f(quantile(pre.map(Math.abs), 0.95))} | ${f(quantile(post, 0.5))} / ${f(quantile(post.map(Math.abs), 0.95))} | ${selfConverged}/${pre.length} | ${committed - pre.length} ok, ${refused} refused | ${overBeyondTail} |`
    table.push(row)
    console.log(row)
    report({ bench: "runtime-qemu", figure: `${link.name} link, ${rate.name}: downtime median (engram, pause → running)`, value: quantile(engramDown, 0.5), unit: "ms" })
    report({ bench: "runtime-qemu", figure: `${link.name} link, ${rate.name}: pre-pause estimate error median`, value: quantile(pre, 0.5), unit: "ms" })
    report({ bench: "runtime-qemu", figure: `${link.name} link, ${rate.name}: post-capture estimate error p95 |e|`, value: quantile(post.map(Math.abs), 0.95), unit: "ms" })
    report({ bench: "runtime-qemu", figure: `${link.name} link, ${rate.name}: committed over budget beyond the commit tail`, value: overBeyondTail, unit: "moves", goal: "0" })
  }
  console.log("\n| link | guest dirtying | committed (2000 ms budget) | engram downtime median / p95 ms | QEMU downtime median ms | pre-pause error median / p95 abs ms | post-capture error median / p95 abs ms | QEMU paused on its own | 120 ms budget | over budget beyond commit tail |")
  console.log("|---|---|---|---|---|---|---|---|---|---|")
  for (const r of table) console.log(r)
})

const scope = Effect.runSync(Scope.make())
await Effect.runPromise(program.pipe(Scope.provide(scope)))
await Effect.runPromise(Scope.close(scope, Exit.void))
