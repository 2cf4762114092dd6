/**
 * An Azure-like VM trace, synthetic and seeded, in the files of the Azure public dataset (a VM
 * table and 5-minute CPU readings), to try `convert-azure` and the policies on a workload shaped
 * like a cloud's rather than like a sandbox service's: deployments of several VMs at once, sizes
 * from the dataset's buckets (2 to >24 cores, 2 to >64 GiB), lifetimes from minutes to days,
 * interactive VMs idle at night and on and off by day, batch VMs busy or idle for long stretches.
 *
 *   pnpm exec tsx examples/azure-like.ts SEED DEPLOYMENTS HOURS OUT [NIGHT_IDLE]
 *
 * writes OUT.vmtable.csv and OUT.cpu.csv (time order), ready for
 * `pnpm sim -- convert-azure --vmtable OUT.vmtable.csv --cpu OUT.cpu.csv --hours HOURS --out OUT.jsonl`.
 */
import { createWriteStream, writeFileSync } from "node:fs"
import { Rng } from "../src/Rng.js"

const [seedArg, deploymentsArg, hoursArg, out, nightIdleArg] = process.argv.slice(2)
if (out === undefined) {
  process.stderr.write("usage: tsx examples/azure-like.ts SEED DEPLOYMENTS HOURS OUT [NIGHT_IDLE]\n")
  process.exit(2)
}
const rng = new Rng(Number(seedArg))
const deployments = Number(deploymentsArg)
const horizonS = Number(hoursArg) * 3600
const nightIdle = Number(nightIdleArg ?? 0.8)

const cores = [["2", 50], ["4", 25], ["8", 15], ["24", 7], [">24", 3]] as const
const memFor: Record<string, readonly (readonly [string, number])[]> = {
  "2": [["2", 40], ["4", 40], ["8", 20]],
  "4": [["4", 30], ["8", 50], ["32", 20]],
  "8": [["8", 30], ["32", 60], ["64", 10]],
  "24": [["32", 30], ["64", 60], [">64", 10]],
  ">24": [["64", 50], [">64", 50]],
}
const pick = (options: readonly (readonly [string, number])[]): string => (options[rng.weighted(options.map(([, w]) => w))] as readonly [string, number])[0]

interface Vm {
  readonly id: string
  readonly createdS: number
  readonly deletedS: number
  readonly cores: string
  readonly mem: string
  readonly interactive: boolean
  readonly steady: boolean
}
const vms: Vm[] = []
const vm = (createdS: number, deletedS: number, c: string, m: string, interactive: boolean): void => {
  vms.push({ id: `vm${vms.length}`, createdS, deletedS, cores: c, mem: m, interactive, steady: rng.chance(0.5) })
}

// Deployments arrive with a daily cycle (peak at 14:00); each brings 1 + Exp(2.5) VMs of one size.
const rate = deployments / horizonS
for (let t = 0; ; ) {
  t += -Math.log(1 - rng.uniform()) / (rate * 1.6)
  if (t >= horizonS) break
  const hour = (t / 3600) % 24
  if (rng.uniform() * 1.6 > 1 + 0.6 * Math.cos((2 * Math.PI * (hour - 14)) / 24)) continue
  const k = 1 + Math.floor(-Math.log(1 - rng.uniform()) * 2.5)
  const c = pick(cores)
  const m = pick(memFor[c] as readonly (readonly [string, number])[])
  const interactive = rng.chance(0.6)
  const lifeS = rng.lognormal(2 * 3600, 2)
  for (let j = 0; j < k; j++) {
    const created = Math.floor(t) + Math.floor(j / 10)
    vm(created, created + Math.floor(lifeS * (0.8 + 0.4 * rng.uniform())) + 300, c, m, interactive)
  }
}
// VMs already running when the trace starts.
for (let j = 0; j < deployments / 2; j++) {
  const c = pick(cores)
  vm(0, Math.floor(rng.lognormal(24 * 3600, 1.5)), c, pick(memFor[c] as readonly (readonly [string, number])[]), rng.chance(0.6))
}

writeFileSync(`${out}.vmtable.csv`, `${vms.map((v) => `${v.id},sub,dep,${v.createdS},${v.deletedS},90,20,80,${v.interactive ? "Interactive" : "Delay-insensitive"},${v.cores},${v.mem}`).join("\n")}\n`)

// Readings every 5 minutes, in time order: interactive VMs idle at night (NIGHT_IDLE of the
// readings) and flip on/off by day; batch VMs flip rarely, half of them never idle.
const busy = vms.map(() => true)
const cpu = createWriteStream(`${out}.cpu.csv`)
for (let t = 0; t < horizonS; t += 300) {
  const hour = (t / 3600) % 24
  const lines: string[] = []
  vms.forEach((v, i) => {
    if (t < Math.floor(v.createdS / 300) * 300 || t >= v.deletedS) return
    let idle: boolean
    if (v.interactive) {
      if (hour < 7 || hour >= 21) idle = rng.chance(nightIdle)
      else {
        if (rng.chance(0.15)) busy[i] = !busy[i]
        idle = !busy[i]
      }
    } else {
      if (rng.chance(0.05)) busy[i] = !busy[i]
      idle = !busy[i] && !v.steady
    }
    const max = idle ? 0.5 + 2.5 * rng.uniform() : 10 + 80 * rng.uniform()
    lines.push(`${t},${v.id},${(max / 2).toFixed(2)},${max.toFixed(2)},${(max * 0.6).toFixed(2)}`)
  })
  if (lines.length > 0) cpu.write(`${lines.join("\n")}\n`)
}
cpu.end(() => process.stderr.write(`${vms.length} VMs written to ${out}.vmtable.csv and ${out}.cpu.csv\n`))
