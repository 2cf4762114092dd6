// Prints the top self-time functions of a V8 CPU profile (`node --cpu-prof`): where the time goes.
//   node tooling/scripts/cpu-profile-top.mjs <file.cpuprofile | dir> [count]
// A directory means its newest .cpuprofile.
import { readdirSync, readFileSync, statSync } from "node:fs"
import { join } from "node:path"

const [arg, countArg] = process.argv.slice(2)
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
for (let i = 0; i < profile.samples.length; i++) {
  const id = profile.samples[i]
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
console.log(`${file}: ${(total / 1000).toFixed(0)} ms sampled; top ${count} by self time`)
for (const [key, us] of rows) console.log(`${((100 * us) / total).toFixed(1).padStart(5)} %  ${(us / 1000).toFixed(0).padStart(6)} ms  ${key}`)
