import { readFileSync } from "node:fs"
import { Report } from "./index.js"
for (const f of process.argv.slice(2)) {
  const rs = JSON.parse(readFileSync(f, "utf8")).map((r: any) => ({ ...r, series: { tMs: [], queue: [], parks: [], reservedPct: [] } }))
  console.log(`### ${f}\n`)
  console.log(Report.markdown(rs))
  const by = Object.fromEntries(rs.map((r: any) => [r.policy, r]))
  const d = by["demand"], fl = by["floor30"], x = by["demand-reserve"]
  if (d && fl && x) {
    const warm = x.warmResumes / d.warmResumes
    console.log(`goal: warm ${x.warmResumes}/${d.warmResumes} = ${warm.toFixed(3)} ${warm >= 0.9 ? "✓" : "✗"}; p99 ${(x.queueWait.p99/1000).toFixed(1)} vs floor ${(fl.queueWait.p99/1000).toFixed(1)}+1 ${x.queueWait.p99 <= fl.queueWait.p99 + 1000 ? "✓" : "✗"}; descents ${x.descents} vs ${fl.descents} ${x.descents <= fl.descents ? "✓" : "✗"}; max ${(x.queueWait.max/1000).toFixed(1)} (demand ${(d.queueWait.max/1000).toFixed(1)}, floor ${(fl.queueWait.max/1000).toFixed(1)})\n`)
  }
}
