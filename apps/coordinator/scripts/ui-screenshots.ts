/**
 * The dashboard's screenshots in packages/dashboard/docs/: a coordinator in this process (the
 * in-memory store) with a small fleet in every state worth seeing — running sessions, parks, a
 * queue, a cordoned host, a committed move and a refused one, a few minutes of history — shown
 * in Debian's Chromium. Run `pnpm --filter @engram/coordinator screenshots` after changing the
 * page, and look at the PNGs before committing them.
 */
import { startCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join, resolve } from "node:path"
import { chromium } from "playwright-core"

const adminToken = "screenshots-admin-token-0123456789"
const out = resolve(import.meta.dirname, "../../../packages/dashboard/docs")
const c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken }, uiHistory: { sampleMs: 250, samples: 400 } })

const call = async (method: string, path: string, body?: unknown) => {
  const res = await fetch(`${c.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${adminToken}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  })
  const text = await res.text()
  return { status: res.status, body: (text === "" ? null : JSON.parse(text)) as Record<string, unknown> & { items?: { id: string; sessionId: string; state: string }[]; moves?: { id: string; sessionId: string; state: string }[] } }
}
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))
const GiB = 1024
/** Bytes in a MiB (`<<` would overflow 32 bits past 2 GiB). */
const MiB = 2 ** 20

for (const [id, gib, cores] of [["host-a", 32, 16], ["host-b", 32, 16], ["host-c", 16, 8]] as const) {
  await call("POST", "/v1/hosts", { id, labels: { rack: "r1" } })
  await call("PUT", `/v1/hosts/${id}/report`, { totalMib: (gib + 1) * GiB, allocatableMib: (gib + 1) * GiB, totalVcpus: cores })
}
const run = async (id: string, mem: number, vcpus: number, host?: string) => {
  await call("POST", "/v1/sessions", { id, memMib: mem, vcpus, ...(host === undefined ? {} : { affinity: [host] }) })
  await call("POST", `/v1/sessions/${id}/started`, {})
}
// A morning: sessions arrive, some go idle and park, the fleet fills up.
const names = ["web-build-17", "notebook-ana", "ci-runner-4", "agent-eval-2", "notebook-kim", "ci-runner-5", "render-job-9", "agent-eval-3"]
for (const [i, id] of names.entries()) {
  await run(id, [4, 8, 2, 6, 4, 2, 8, 6][i]! * GiB, [2, 4, 1, 2, 2, 1, 4, 2][i]!, ["host-a", "host-b", "host-c"][i % 3])
  await sleep(400)
}
for (const id of ["notebook-ana", "notebook-kim", "agent-eval-2"]) {
  await call("POST", `/v1/sessions/${id}/idle`, {})
  await sleep(500)
}
// A move that commits and one the guard refuses.
const pending = async (source: string, session: string) => {
  for (;;) {
    const a = await call("GET", `/v1/hosts/${source}/assignments?waitMs=2000`)
    const m = a.body.moves?.find((x) => x.sessionId === session && x.state === "pending")
    if (m !== undefined) return m.id
  }
}
const moved = call("POST", "/v1/sessions/web-build-17/move", { targetHostId: "host-b", maxDowntimeMs: 600 })
const m1 = await pending("host-a", "web-build-17")
await call("POST", `/v1/moves/${m1}/rounds`, { kind: "full", wireBytes: 1200 * MiB, apparentBytes: 4096 * MiB, sendMs: 2400, captureMs: 310 })
await call("POST", `/v1/moves/${m1}/rounds`, { kind: "delta", wireBytes: 96 * MiB, apparentBytes: 180 * MiB, sendMs: 190, captureMs: 42 })
await call("POST", `/v1/moves/${m1}/rounds`, { kind: "final", wireBytes: 12 * MiB, apparentBytes: 20 * MiB, sendMs: 31, captureMs: 38 })
await call("POST", `/v1/moves/${m1}/commit`, { downtimeMs: 512, captureMs: 38, sendMs: 31, commitMs: 420 })
await moved
const refused = call("POST", "/v1/sessions/render-job-9/move", { targetHostId: "host-b", maxDowntimeMs: 300 })
const m2 = await pending("host-a", "render-job-9")
await call("POST", `/v1/moves/${m2}/rounds`, { kind: "full", wireBytes: 2400 * MiB, apparentBytes: 8192 * MiB, sendMs: 4100, captureMs: 520 })
await call("POST", `/v1/moves/${m2}/abort`, { reason: "estimate over budget", estimateMs: 811 })
await refused
// Then a burst that does not fit: a queue, and a host taken out of service.
await call("POST", "/v1/hosts/host-c/cordon", {})
for (const [id, gib] of [["train-xl-1", 24], ["train-xl-2", 24], ["bigmem-1", 64]] as const) {
  await call("POST", "/v1/sessions", { id, memMib: gib * GiB, vcpus: 8 })
  await sleep(700)
}
await sleep(1500)

const profile = mkdtempSync(join(tmpdir(), "engram-shots-"))
const browser = await chromium.launchPersistentContext(profile, {
  executablePath: "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1280, height: 900 },
  deviceScaleFactor: 1,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
})
try {
  const page = await browser.newPage()
  await page.goto(`${c.url}/ui`)
  await page.getByLabel("Admin token").fill(adminToken)
  await page.getByRole("button", { name: "Sign in" }).click()
  await page.locator('[data-series="queue"] svg[data-points]').waitFor()
  await page.locator("#moves tr", { hasText: "refused" }).waitFor()
  await page.screenshot({ path: join(out, "fleet.png"), fullPage: true })

  await page.goto(`${c.url}/ui#/sessions`)
  await page.locator("table.sessions").waitFor()
  await page.screenshot({ path: join(out, "sessions.png"), fullPage: true })

  await page.goto(`${c.url}/ui#/sessions/web-build-17`)
  await page.locator("#session-move .verdict", { hasText: "committed" }).waitFor()
  await page.screenshot({ path: join(out, "session.png"), fullPage: true })
} finally {
  await browser.close()
  await c.stop()
  rmSync(profile, { recursive: true, force: true })
}
process.stdout.write(`screenshots written to ${out}\n`)
