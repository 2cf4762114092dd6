/**
 * runtime-qemu bench, on real guests (TCG here). Two parts:
 *
 * - **moves**: a table like seed 004's hardware report. For each guest dirty rate (0, 64 and
 *   256 MiB/s over a 64 MiB ring of a 256 MiB guest) and each budget (100 … 800 ms), n moves
 *   between two runtimes of this process (A → B → A …, 1 GiB/s over loopback), the guard's
 *   commit allowance learned per direction from the commits before (core's
 *   `Downtime.commitAllowance`, 400 ms before any): moves committed, refused before any pause,
 *   given back after the pause, the downtime range, the commit phase, the estimate's error, and
 *   the overruns past the documented tail (a committed move over its budget by more than its
 *   commit exceeded the allowance).
 * - **snapshots**: descent, cold resume (restore to the guest's ready line), warm resume (unpark
 *   to the guest's next line) and template start (to the ready line), each mapped (RAM files)
 *   and stream (anonymous RAM), for guests that filled most of their RAM at boot; every resume
 *   checks the guest's counter continued (same boot, a higher count).
 *
 * `pnpm --filter @engram/runtime-qemu bench` runs a short version (2 per cell, 256 MiB
 * guests). The README's table: `ENGRAM_BENCH_MOVES=8 ENGRAM_BENCH_SNAPSHOTS=8
 * ENGRAM_BENCH_SIZES=256,1024`. `ENGRAM_BENCH_PARTS=moves` or `snapshots` runs one part. Every
 * move and capture goes to `.bench/runtime-qemu-moves.jsonl` and `.bench/runtime-qemu-snapshots.jsonl`.
 */
import { appendFileSync, mkdirSync, mkdtempSync } from "node:fs"
import { loadavg, tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { report, resultsFile } from "@engram/bench"
import { cmdline, consoleTicks, ensureGuest, readyLine } from "@engram/guest"
import { Downtime } from "@engram/core"
import { ImageStore, Move, type MoveBudget, type VmSpec } from "@engram/runtime"
import { Effect, Exit, Schedule, Scope } from "effect"
import { QemuRuntime, type QemuRuntimeShape } from "../src/index.js"

const env = process.env
const list = (name: string, fallback: string) => (env[name] ?? fallback).split(",").map((x) => x.trim()).filter((x) => x !== "")
const MOVES = Number(env["ENGRAM_BENCH_MOVES"] ?? 2)
const SNAPSHOTS = Number(env["ENGRAM_BENCH_SNAPSHOTS"] ?? 2)
const SIZES = list("ENGRAM_BENCH_SIZES", "256").map(Number)
const PARTS = new Set(list("ENGRAM_BENCH_PARTS", "moves,snapshots"))
const BUDGETS = list("ENGRAM_BENCH_BUDGETS", "800,600,300,200,100").map(Number)
const RATES = list("ENGRAM_BENCH_RATES", "0,64,256").map(Number)
const PRIOR_MS = 400

const quantile = (xs: readonly number[], q: number) => {
  if (xs.length === 0) return Number.NaN
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))] as number
}
const f = (x: number) => (Number.isFinite(x) ? (Math.abs(x) >= 100 ? x.toFixed(0) : x.toFixed(1)) : "–")
const jsonl = (name: string, row: unknown) => {
  mkdirSync(dirname(resultsFile), { recursive: true })
  appendFileSync(join(dirname(resultsFile), name), `${JSON.stringify(row)}\n`)
}

/** Polls until the guest has printed a counter line (a guest that booted and runs). */
const awaitCounter = (rt: QemuRuntimeShape, vmId: string) =>
  Effect.suspend(() => (consoleTicks(rt.consolePath(vmId)).length >= 1 ? Effect.void : Effect.fail(new Error(`${vmId} prints no counter`)))).pipe(
    Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 6000 }),
  )
const lastTick = (rt: QemuRuntimeShape, vmId: string) => consoleTicks(rt.consolePath(vmId)).at(-1)

const program = Effect.gen(function* () {
  const guest = yield* Effect.promise(() => ensureGuest({ log: (l) => console.log(l) }))
  /** Each bench VM's load, by its id: `mv-<MiB/s>` a mover, `snap-<MiB>-…` a filled guest, `@template-…` a plain boot. */
  const boot = (spec: VmSpec) => {
    const m = /^mv-(\d+)/.exec(spec.vmId)
    const rate = m === null ? 0 : Number(m[1])
    const load = m !== null ? { dirtyKibPerSec: rate * 1024, hotMib: rate === 0 ? 4 : 64 } : spec.vmId.startsWith("snap-") ? { dirtyKibPerSec: 0, hotMib: 4, fillMib: Math.round(spec.memMib * 0.75 - 64) } : { dirtyKibPerSec: 0, hotMib: 4 }
    return { kernel: guest.kernel, initrd: guest.initrd, append: cmdline(load) }
  }
  const runtime = (memory: "file" | "anonymous") => QemuRuntime.make({ stateDir: mkdtempSync(join(tmpdir(), "eq-bench-")), boot, readyLine, memory, accelerator: "tcg" })
  const A = yield* runtime("file")
  console.log(`runtime: ${(yield* A.info).detail}`)
  const load = () => loadavg()[0]!.toFixed(1)
  console.log(`load average at start: ${load()}`)
  if (PARTS.has("moves")) yield* moves(A, yield* runtime("file"))
  if (PARTS.has("snapshots")) yield* snapshots({ mapped: A, stream: yield* runtime("anonymous") })
  console.log(`load average at the end: ${load()}`)
})

/** The move table. */
const moves = (A: QemuRuntimeShape, B: QemuRuntimeShape) =>
  Effect.gen(function* () {
    const history: Record<string, number[]> = { "A→B": [], "B→A": [] }
    const rows: string[] = []
    let idleOk = 0
    let idleAt200 = 0
    for (const rate of RATES) {
      const spec: VmSpec = { vmId: `mv-${rate}`, memMib: 256, vcpus: 1 }
      let here = A
      let there = B
      yield* here.start(spec)
      yield* awaitCounter(here, spec.vmId)
      for (const maxDowntimeMs of BUDGETS) {
        const cell = { ok: 0, refused: 0, aborted: 0, failed: 0, down: [] as number[], commit: [] as number[], allowance: [] as number[], err: [] as number[], overTail: 0 }
        for (let i = 0; i < MOVES; i++) {
          const dir = here === A ? "A→B" : "B→A"
          const allowance = Downtime.commitAllowance(history[dir]!, { priorMs: PRIOR_MS })
          const budget: MoveBudget = { maxDowntimeMs, commitAllowanceMs: allowance.allowanceMs, maxPreCopyRounds: 8 }
          const before = lastTick(here, spec.vmId)
          const out = yield* Move.between(here, there, spec.vmId, { moveId: `${spec.vmId}-${maxDowntimeMs}-${i}`, budget }).pipe(Effect.result)
          if (out._tag === "Failure") {
            cell.failed++
            console.log(`move failed: ${out.failure.message}`)
            continue
          }
          const o = out.success
          jsonl("runtime-qemu-moves.jsonl", { rateMibS: rate, maxDowntimeMs, allowance, out: o })
          cell.allowance.push(allowance.allowanceMs)
          if (o._tag === "Committed") {
            ;[here, there] = [there, here]
            history[dir]!.push(o.phases.commitMs)
            cell.ok++
            cell.down.push(o.phases.downtimeMs)
            cell.commit.push(o.phases.commitMs)
            cell.err.push(o.estimateMs - o.phases.downtimeMs)
            const tail = Math.max(0, o.phases.commitMs - allowance.allowanceMs)
            if (o.phases.downtimeMs > maxDowntimeMs + tail) cell.overTail++
            // The guest continued on the target.
            yield* Effect.suspend(() => {
              const t = lastTick(here, spec.vmId)
              return t !== undefined && before !== undefined && t.bootId === before.bootId && t.n > before.n ? Effect.void : Effect.fail("no tick yet")
            }).pipe(Effect.retry({ schedule: Schedule.spaced("50 millis"), times: 200 }), Effect.orDie)
          } else if (o.stage === "pre-pause" && o.pausedMs === null) cell.refused++
          else cell.aborted++
        }
        if (rate === 0 && maxDowntimeMs === 200) {
          idleOk = cell.ok
          idleAt200 = MOVES
        }
        const range = cell.down.length === 0 ? "–" : `${f(Math.min(...cell.down))}–${f(Math.max(...cell.down))}`
        const row = `| ${maxDowntimeMs} ms | ${rate} MiB/s | ${cell.ok}/${MOVES} ok | ${cell.refused} | ${cell.aborted}${cell.failed > 0 ? ` (+${cell.failed} failed)` : ""} | ${range} | ${f(quantile(cell.commit, 0.5))} | ${f(quantile(cell.allowance, 0.5))} | ${f(quantile(cell.err, 0.5))} / ${f(quantile(cell.err.map(Math.abs), 0.95))} | ${cell.overTail} |`
        rows.push(row)
        console.log(row)
      }
      yield* here.destroy(spec.vmId)
    }
    console.log("\n| budget | guest dirtying | moves ok | refused before any pause | given back after the pause | downtime range ms | commit median ms | allowance median ms | estimate error median / p95 abs ms | overruns past the documented tail |")
    console.log("|---|---|---|---|---|---|---|---|---|---|")
    for (const r of rows) console.log(r)
    if (idleAt200 > 0) report({ bench: "runtime-qemu", figure: "idle 256 MiB guest, 200 ms budget, learned allowance: moves ok", value: (100 * idleOk) / idleAt200, unit: "%", goal: ">= 90" })
  })

/** The snapshot figures: descent, cold resume, warm resume, template start; mapped vs stream. */
const snapshots = (runtimes: { readonly mapped: QemuRuntimeShape; readonly stream: QemuRuntimeShape }) =>
  Effect.gen(function* () {
    const rows: string[] = []
    for (const size of SIZES) {
      for (const method of ["mapped", "stream"] as const) {
        const rt = runtimes[method]
        const spec: VmSpec = { vmId: `snap-${size}-${method}`, memMib: size, vcpus: 1 }
        const images = ImageStore.directory(mkdtempSync(join(tmpdir(), "eq-bench-images-")))
        const started = yield* rt.start(spec)
        yield* awaitCounter(rt, spec.vmId)
        const times = { descent: [] as number[], cold: [] as number[], warm: [] as number[], template: [] as number[] }
        let continued = 0
        for (let i = 0; i < SNAPSHOTS; i++) {
          yield* rt.park(spec.vmId)
          const w0 = performance.now()
          yield* rt.unpark(spec.vmId)
          times.warm.push(performance.now() - w0)
          const before = lastTick(rt, spec.vmId)
          const d0 = performance.now()
          const image = yield* rt.descend(spec.vmId, yield* images.prepare(spec.vmId))
          times.descent.push(performance.now() - d0)
          const back = yield* rt.restore(spec, image)
          times.cold.push(back.launch.readyMs)
          yield* awaitCounter(rt, spec.vmId)
          const after = lastTick(rt, spec.vmId)
          if (before !== undefined && after !== undefined && after.bootId === before.bootId && after.n > before.n) continued++
          jsonl("runtime-qemu-snapshots.jsonl", { size, method, i, descent: image.detail, descentMs: times.descent.at(-1), restore: back.launch })
        }
        yield* rt.destroy(spec.vmId)
        yield* rt.buildTemplate({ name: `t${size}`, memMib: size, vcpus: 1 })
        for (let i = 0; i < SNAPSHOTS; i++) {
          const clone = yield* rt.start({ vmId: `tpl-${size}-${i}`, memMib: size, vcpus: 1 }, { template: `t${size}` })
          times.template.push(clone.launch.readyMs)
          jsonl("runtime-qemu-snapshots.jsonl", { size, method, i, template: clone.launch })
          yield* rt.destroy(clone.vmId)
        }
        yield* rt.removeTemplate(`t${size}`)
        const cell = (xs: number[]) => `${f(quantile(xs, 0.5))} / ${f(quantile(xs, 0.95))}`
        const row = `| ${size} MiB | ${method} | ${cell(times.descent)} | ${cell(times.cold)} | ${cell(times.warm)} | ${cell(times.template)} | ${continued}/${SNAPSHOTS} | ${f(started.launch.readyMs / 1000)} s |`
        rows.push(row)
        console.log(row)
        for (const [what, xs] of Object.entries(times)) report({ bench: "runtime-qemu", figure: `${size} MiB ${method}: ${what} median`, value: quantile(xs, 0.5), unit: "ms" })
      }
    }
    console.log("\n| guest | snapshots | descent ms (median / p95) | cold resume to ready ms | warm resume to ready ms | template start to ready ms | counter continued | its boot to ready |")
    console.log("|---|---|---|---|---|---|---|---|")
    for (const r of rows) console.log(r)
  })

const scope = Effect.runSync(Scope.make())
await Effect.runPromise(program.pipe(Scope.provide(scope)))
await Effect.runPromise(Scope.close(scope, Exit.void))
