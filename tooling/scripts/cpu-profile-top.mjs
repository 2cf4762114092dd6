// Prints the top self-time functions of a V8 CPU profile (`node --cpu-prof`): where the time goes.
//   node tooling/scripts/cpu-profile-top.mjs <file.cpuprofile | dir> [count] [--after <ms>]
// A directory means its newest .cpuprofile. `--after` skips the samples of the first <ms> of the
// profile (a process's start-up and module loading), so the rest is the steady state.
import { readdirSync, readFileSync, statSync } from "node:fs"
import { join } from "node:path"

const argv = process.argv.slice(2)
const afterAt = argv.indexOf("--after")
const afterMs = afterAt === -1 ? 0 : Number(argv.splice(afterAt, 2)[1])
const [arg, countArg] = argv
if (arg === undefined) {
  console.error("usage: cpu-profile-top.mjs <file.cpuprofile | dir> [count]")
  process.exit(2)
}
const file = statSync(arg).isDirectory()
  ? readdirSync(arg)
      .filter((f) => f.endsWith(".cpuprofile"))
      .map((f) => join(arg, f))
      .sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs)[0]
  : arg
if (file === undefined) {
  console.error(`no .cpuprofile in ${arg}`)
  process.exit(2)
}
const profile = JSON.parse(readFileSync(file, "utf8"))
const count = Number(countArg ?? 15)
const byId = new Map(profile.nodes.map((n) => [n.id, n]))
const dt = new Map()
// Each sample's time is the delta to the next; attribute it to the sampled node (self time).
let at = 0
for (let i = 0; i < profile.samples.length; i++) {
  const id = profile.samples[i]
  at += profile.timeDeltas[i] ?? 0
  if (at < afterMs * 1000) continue
  dt.set(id, (dt.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0))
}
const self = new Map()
let total = 0
for (const [id, us] of dt) {
  const n = byId.get(id)
  const cf = n.callFrame
  const where = cf.url === "" ? "" : `${cf.url.replace(/^.*\/(node_modules|packages|apps|tooling)\//, "$1/")}:${cf.lineNumber + 1}`
  const key = `${cf.functionName || "(anonymous)"} ${where}`.trim()
  self.set(key, (self.get(key) ?? 0) + us)
  total += us
}
const rows = [...self].sort((a, b) => b[1] - a[1]).slice(0, count)
console.log(`${file}: ${(total / 1000).toFixed(0)} ms sampled${afterMs > 0 ? ` after the first ${afterMs} ms` : ""}; top ${count} by self time`)
for (const [key, us] of rows) console.log(`${((100 * us) / total).toFixed(1).padStart(5)} %  ${(us / 1000).toFixed(0).padStart(6)} ms  ${key}`)
