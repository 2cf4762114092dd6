// The dashboard at /ui in a real browser (Debian's Chromium driven by playwright-core) against
// a real coordinator: what a person sees. Sign-in (a wrong token is refused, the admin token
// is kept for the tab), hosts as bars with their figures, a queued session with its reason,
// a park, and a move with its phases and one with its verdict, each appearing without a reload.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { existsSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { chromium } from "playwright-core"
import type { BrowserContext, Page } from "playwright-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client, uid } from "./support/http.js"

const adminToken = "ui-admin-token-0123456789"
const chromiumPath = "/usr/bin/chromium"
const profile = mkdtempSync(join(tmpdir(), "engram-ui-chromium-"))

let c: RunningCoordinator
let browser: BrowserContext
let page: Page
const big = uid("big")
const small = uid("small")

beforeAll(async () => {
  if (!existsSync(chromiumPath)) throw new Error(`${chromiumPath} is missing: apt-get install -y chromium (.ci/run installs it)`)
  c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken } })
  const api = client(c.url, adminToken)
  for (const [id, mib, vcpus] of [[big, 8192, 8], [small, 4096, 4]] as const) {
    expect((await api.post("/v1/hosts", { id })).status).toBe(201)
    expect((await api.put(`/v1/hosts/${id}/report`, { totalMib: mib + 1024, allocatableMib: mib + 1024, totalVcpus: vcpus })).status).toBe(200)
  }
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: chromiumPath,
    headless: true,
    viewport: { width: 1280, height: 900 },
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  })
  page = await browser.newPage()
})
afterAll(async () => {
  await browser?.close()
  await c?.stop()
  rmSync(profile, { recursive: true, force: true })
})

const text = async (selector: string) => (await page.locator(selector).textContent()) ?? ""

describe("the dashboard", () => {
  it("asks for a token, refuses a wrong one, and shows the hosts as bars with the admin token", async () => {
    await page.goto(`${c.url}/`)
    expect(page.url()).toBe(`${c.url}/ui`)
    await page.getByLabel("Admin token").fill("not-the-token-0123456789")
    await page.getByRole("button", { name: "Sign in" }).click()
    await page.getByText("The coordinator refused this token.").waitFor()
    expect(await page.locator("#board").isVisible()).toBe(false)

    await page.getByLabel("Admin token").fill(adminToken)
    await page.getByRole("button", { name: "Sign in" }).click()
    const card = page.locator(`[data-host="${big}"]`)
    await card.waitFor()
    expect(await card.locator("h3").textContent()).toBe(big)
    expect(await card.locator(".badge").textContent()).toBe("ready")
    expect(await card.locator(".figures.ram").textContent()).toBe("RAM 0 MiB reserved · 0 MiB parked · 8 GiB free of 8 GiB")
    expect(await card.locator(".figures.cpu").textContent()).toBe("vCPUs 0 reserved · 0 parked · 32 free of 32")
    expect(await card.getByRole("img").first().getAttribute("aria-label")).toBe("RAM 0 MiB reserved · 0 MiB parked · 8 GiB free of 8 GiB")
    expect(await text("#signal")).toBe("2/2 hosts ready · RAM 12 GiB free of 12 GiB · vCPUs 48 free of 48 · queue 0 (0 without room) · 0 parks · 0 descents")
  })

  it("shows a session that fits nowhere in the queue with its reason, and a park with its host", async () => {
    const api = client(c.url, adminToken)
    const q = uid("q")
    expect((await api.post("/v1/sessions", { id: q, memMib: 16 * 1024, vcpus: 1 })).status).toBe(202)
    const row = page.locator("#queue tr", { hasText: q })
    await row.waitFor()
    expect(await row.locator("td").allTextContents()).toEqual(["1", q, "16 GiB, 1 vCPU", expect.stringMatching(/^\d+ ms$|^\d+s$/), "0/2 hosts have room: 2 ram_full (too big for any host)"])

    const p = uid("p")
    expect((await api.post("/v1/sessions", { id: p, memMib: 1024, vcpus: 2, affinity: [big] })).status).toBe(201)
    expect((await api.post(`/v1/sessions/${p}/started`)).status).toBe(200)
    // The gate parks only while no queued session is without room: end the queued one first.
    expect((await api.del(`/v1/sessions/${q}`)).status).toBe(200)
    await page.locator("#queue", { hasText: "Nothing waits." }).waitFor()
    expect((await api.post(`/v1/sessions/${p}/idle`)).body).toMatchObject({ state: "parked" })
    const park = page.locator("#parks tr", { hasText: p })
    await park.waitFor()
    expect((await park.locator("td").allTextContents()).slice(0, 3)).toEqual([p, big, "1 GiB"])
    const card = page.locator(`[data-host="${big}"] .figures.ram`)
    await page.locator(`[data-host="${big}"] .figures.ram`, { hasText: "1 GiB parked" }).waitFor()
    expect(await card.textContent()).toBe("RAM 0 MiB reserved · 1 GiB parked · 7 GiB free of 8 GiB")
    await api.del(`/v1/sessions/${p}`)
  })

  it("shows a move in progress, then its phases once committed, and a refused move with its verdict", async () => {
    const api = client(c.url, adminToken)
    const s = uid("m")
    expect((await api.post("/v1/sessions", { id: s, memMib: 512, vcpus: 1, affinity: [small] })).status).toBe(201)
    expect((await api.post(`/v1/sessions/${s}/started`)).status).toBe(200)

    // The source agent's part, by hand over the API: rounds, then commit.
    const committed = api.post(`/v1/sessions/${s}/move`, { targetHostId: big, maxDowntimeMs: 700 })
    const move = await pendingMove(small, s)
    expect((await api.post(`/v1/moves/${move}/rounds`, { kind: "full", wireBytes: 64 << 20, apparentBytes: 512 << 20, sendMs: 300, captureMs: 40 })).status).toBe(200)
    const row = page.locator("#moves tr", { hasText: s })
    await page.locator("#moves tr", { hasText: "in progress: 1 round, last full" }).waitFor()
    expect((await row.locator("td").allTextContents()).slice(0, 4)).toEqual([s, `${small} → ${big}`, "700 ms", "pending"])
    expect((await api.post(`/v1/moves/${move}/rounds`, { kind: "final", wireBytes: 4 << 20, apparentBytes: 8 << 20, sendMs: 80, captureMs: 40 })).status).toBe(200)
    expect((await api.post(`/v1/moves/${move}/commit`, { downtimeMs: 560, captureMs: 40, sendMs: 80, commitMs: 390 })).status).toBe(200)
    expect((await committed).status).toBe(200)
    const done = page.locator("#moves tr", { hasText: "committed: paused 560 ms" })
    await done.waitFor()
    expect(await done.locator("td").last().textContent()).toBe("committed: paused 560 ms (capture 40 ms · send 80 ms · commit 390 ms)")

    const refused = api.post(`/v1/sessions/${s}/move`, { targetHostId: small, maxDowntimeMs: 300 })
    const back = await pendingMove(big, s)
    // Seen while it runs (a coordinator without a move list shows the moves the page saw pending).
    await page.locator("#moves tr", { hasText: `${big} → ${small}` }).filter({ hasText: "starting" }).waitFor()
    expect((await api.post(`/v1/moves/${back}/abort`, { reason: "estimate over budget", estimateMs: 812 })).status).toBe(200)
    expect((await refused).status).toBe(503)
    const verdict = page.locator("#moves tr", { hasText: "refused: estimate 812 ms > budget 300 ms" })
    await verdict.waitFor()
    expect((await verdict.locator("td").allTextContents()).slice(0, 4)).toEqual([s, `${big} → ${small}`, "300 ms", "aborted"])
    await api.del(`/v1/sessions/${s}`)
  })

  it("keeps the token for the tab across a reload, and forgets it on sign-out", async () => {
    await page.reload()
    await page.locator(`[data-host="${small}"]`).waitFor()
    await page.getByRole("button", { name: "Sign out" }).click()
    await page.getByLabel("Admin token").waitFor()
    expect(await page.evaluate(() => sessionStorage.getItem("engram-token"))).toBe(null)
  })
})

describe("the API reference at /docs", () => {
  it("its curl samples send the bearer token, not Basic credentials", async () => {
    const docs = await browser.newPage()
    try {
      await docs.goto(`${c.url}/docs`)
      // The request sample of the first endpoint that needs a credential, once Scalar has drawn it.
      const sample = async () => /--header 'Authorization: [^']*'/.exec(await docs.evaluate(() => document.body.innerText))?.[0] ?? ""
      await expect.poll(sample, { timeout: 30_000 }).not.toBe("")
      expect(await sample()).toMatch(/^--header 'Authorization: Bearer \S+'$/)
      expect(await docs.evaluate(() => document.body.innerText)).not.toMatch(/Authorization: Basic/)
    } finally {
      await docs.close()
    }
  })
})

/** The pending move of a session, as its source host's assignments show it. */
const pendingMove = async (sourceHostId: string, sessionId: string): Promise<string> => {
  const api = client(c.url, adminToken)
  for (;;) {
    const a = await api.get(`/v1/hosts/${sourceHostId}/assignments?waitMs=2000`)
    const m = (a.body.moves as { id: string; sessionId: string; state: string }[]).find((x) => x.sessionId === sessionId && x.state === "pending")
    if (m !== undefined) return m.id
  }
}
