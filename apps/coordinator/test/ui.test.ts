// The dashboard at /ui in a real browser (Debian's Chromium driven by playwright-core) against
// a real coordinator: what a person sees. Sign-in (a wrong token is refused, the admin token
// is kept for the tab), hosts as bars with their figures, a queued session with its reason,
// a park, and a move with its phases and one with its verdict, each appearing without a reload,
// with who committed it;
// the sessions list and its filters, a session's page with its events and its actions (park,
// resume, a move within a budget, end), the hosts' actions, and the charts over time.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { existsSync, mkdtempSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { chromium } from "playwright-core"
import type { BrowserContext, Page } from "playwright-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client, pendingMove as pendingMoveOf, uid } from "./support/http.js"

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
  c = await startCoordinator({ store: StoreSim.layer(), reaper: false, logLevel: "Error", config: { port: 0, adminToken }, uiHistory: { sampleMs: 100 } })
  const api = client(c.url, adminToken)
  for (const [id, mib, vcpus] of [[big, 8192, 8], [small, 4096, 4]] as const) {
    expect((await api.post("/v1/hosts", { id })).status).toBe(201)
    expect((await api.put(`/v1/hosts/${id}/report`, { totalMib: mib + 1024, allocatableMib: mib + 1024, totalVcpus: vcpus, peerUrl: `http://${id}.test:7100` })).status).toBe(200)
  }
  browser = await chromium.launchPersistentContext(profile, {
    executablePath: chromiumPath,
    headless: true,
    viewport: { width: 1280, height: 900 },
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  })
  // A busy 2-core CI machine (every package's tests at once) can take more than Playwright's 30 s
  // to parse a page's scripts (Scalar's bundle is megabytes): each step waits up to 2 minutes,
  // and each test has 5 (the file's tests are sequential, so a slow step costs only time).
  browser.setDefaultTimeout(120_000)
  browser.setDefaultNavigationTimeout(120_000)
  page = await browser.newPage()
})
afterAll(async () => {
  await browser?.close()
  await c?.stop()
  rmSync(profile, { recursive: true, force: true })
})

const text = async (selector: string) => (await page.locator(selector).textContent()) ?? ""

describe("the dashboard", { timeout: 300_000 }, () => {
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
    expect((await row.locator("td").allTextContents()).slice(0, 5)).toEqual([s, `${small} → ${big}`, "700 ms", "pending", "-"])
    expect((await api.post(`/v1/moves/${move}/rounds`, { kind: "final", wireBytes: 4 << 20, apparentBytes: 8 << 20, sendMs: 80, captureMs: 40 })).status).toBe(200)
    const guard = { allowanceMs: 400, allowanceSource: "prior", allowanceSamples: 0, estimateMs: 600 }
    expect((await api.post(`/v1/moves/${move}/commit`, { downtimeMs: 560, captureMs: 40, sendMs: 80, commitMs: 390, guard })).status).toBe(200)
    expect((await committed).status).toBe(200)
    const done = page.locator("#moves tr", { hasText: "committed: paused 560 ms" })
    await done.waitFor()
    expect(await done.locator("td").last().textContent()).toBe("committed: paused 560 ms (capture 40 ms · send 80 ms · commit 390 ms)")
    // Who committed it: its source, with its phases (the By column).
    expect((await done.locator("td").allTextContents()).slice(3, 5)).toEqual(["committed", "source"])

    const refused = api.post(`/v1/sessions/${s}/move`, { targetHostId: small, maxDowntimeMs: 300 })
    const back = await pendingMove(big, s)
    // Seen while it runs (a coordinator without a move list shows the moves the page saw pending).
    await page.locator("#moves tr", { hasText: `${big} → ${small}` }).filter({ hasText: "starting" }).waitFor()
    expect((await api.post(`/v1/moves/${back}/abort`, { reason: "estimate over budget", estimateMs: 812 })).status).toBe(200)
    expect((await refused).status).toBe(503)
    const verdict = page.locator("#moves tr", { hasText: "refused: estimate 812 ms > budget 300 ms" })
    await verdict.waitFor()
    expect((await verdict.locator("td").allTextContents()).slice(0, 5)).toEqual([s, `${big} → ${small}`, "300 ms", "aborted", "-"])
    await api.del(`/v1/sessions/${s}`)
  })

  it("shows a move committed on a resolution as such, and says so once its source owes a resend (it holds the only copy and owes the target the stream)", async () => {
    const api = client(c.url, adminToken)
    const s = uid("o")
    expect((await api.post("/v1/sessions", { id: s, memMib: 512, vcpus: 1, affinity: [small] })).status).toBe(201)
    expect((await api.post(`/v1/sessions/${s}/started`)).status).toBe(200)
    const moving = api.post(`/v1/sessions/${s}/move`, { targetHostId: big, maxDowntimeMs: 650 })
    const move = await pendingMove(small, s)
    expect((await api.post(`/v1/moves/${move}/rounds`, { kind: "final", wireBytes: 4 << 20, apparentBytes: 8 << 20, sendMs: 80, captureMs: 40 })).status).toBe(200)
    expect((await api.post(`/v1/moves/${move}/resolve`, { outcome: "commit", reason: "the source is unreachable" })).status).toBe(200)
    expect((await moving).status).toBe(200)
    const row = page.locator("#moves tr", { hasText: "650 ms" })
    // Before: "in progress: 1 round, last final" for a committed move.
    await row.filter({ hasText: "committed on a resolution: pause not measured" }).waitFor()
    // The admin's resolve: an operator committed it (the By column).
    expect((await row.locator("td").allTextContents()).slice(3, 5)).toEqual(["committed", "operator"])
    expect((await api.post(`/v1/moves/${move}/resend`, { owed: true })).status).toBe(200)
    // The page redraws on the fleet's next change (the mark alone changes no host, queue or
    // pending move): a host's report, as its agent sends every few seconds.
    expect((await api.put(`/v1/hosts/${small}/report`, { totalMib: 4096 + 1024, allocatableMib: 4096 + 1024, totalVcpus: 4, peerUrl: `http://${small}.test:7100` })).status).toBe(200)
    const owed = row.filter({ hasText: "committed, resend owed: the source holds the only copy and owes the target the stream" })
    await owed.waitFor()
    expect((await owed.locator("td").allTextContents()).slice(0, 5)).toEqual([s, `${small} → ${big}`, "650 ms", "committed", "operator"])
    expect((await api.post(`/v1/moves/${move}/resend`, { owed: false })).status).toBe(200)
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

/** The pending move of a session, as its source host's assignments show it. */
const pendingMove = (sourceHostId: string, sessionId: string) => pendingMoveOf(client(c.url, adminToken), sourceHostId, sessionId)

/** Signs in on the dashboard (a tab that signed out asks again), then opens `hash`. */
const signedIn = async (hash: string) => {
  await page.goto(`${c.url}/ui${hash}`)
  const form = page.getByLabel("Admin token")
  if (await form.isVisible()) {
    await form.fill(adminToken)
    await page.getByRole("button", { name: "Sign in" }).click()
  }
  await page.locator("#board").waitFor()
}

/** The cells of the sessions view's rows, first column (the id) only. */
const listedIds = async () => (await page.locator("table.sessions tbody tr td:first-child").allTextContents()).sort()

describe("the sessions and a session's page", { timeout: 300_000 }, () => {
  it("lists sessions, filters them by state, host and id, and opens one's page", async () => {
    const api = client(c.url, adminToken)
    const tag = uid("list")
    const [run, park, wait] = [`${tag}-run`, `${tag}-park`, `${tag}-wait`]
    expect((await api.post("/v1/sessions", { id: run, memMib: 512, vcpus: 1, affinity: [small] })).status).toBe(201)
    expect((await api.post("/v1/sessions", { id: park, memMib: 512, vcpus: 1, affinity: [big] })).status).toBe(201)
    for (const id of [run, park]) expect((await api.post(`/v1/sessions/${id}/started`)).status).toBe(200)
    expect((await api.post(`/v1/sessions/${park}/idle`)).body).toMatchObject({ state: "parked" })
    expect((await api.post("/v1/sessions", { id: wait, memMib: 64 * 1024, vcpus: 1 })).status).toBe(202)

    await signedIn(`#/sessions?q=${tag}`)
    await expect.poll(listedIds, { timeout: 120_000 }).toEqual([park, run, wait].sort())
    const row = page.locator("table.sessions tbody tr", { hasText: park })
    expect((await row.locator("td").allTextContents()).slice(0, 4)).toEqual([park, "parked", big, "512 MiB, 1 vCPU"])
    expect(await page.locator(".count").textContent()).toBe(`3 sessions with "${tag}" in the id`)

    await page.getByLabel("State", { exact: true }).selectOption("parked")
    await expect.poll(listedIds, { timeout: 120_000 }).toEqual([park])
    expect(page.url()).toContain("state=parked")
    await page.getByLabel("State", { exact: true }).selectOption("")
    await page.getByLabel("Host", { exact: true }).selectOption(small)
    await expect.poll(listedIds, { timeout: 120_000 }).toEqual([run])
    await page.getByLabel("Host", { exact: true }).selectOption("")
    // The cleared filter builds the form again: type into the new one, once it shows every session.
    await expect.poll(listedIds, { timeout: 120_000 }).toEqual([park, run, wait].sort())
    await page.getByLabel("Id", { exact: true }).fill(`${tag}-wa`)
    await page.getByLabel("Id", { exact: true }).press("Enter")
    await expect.poll(listedIds, { timeout: 120_000 }).toEqual([wait])

    await page.getByRole("link", { name: wait }).click()
    await page.locator("#session-title", { hasText: `Session ${wait}` }).waitFor()
    expect(page.url()).toBe(`${c.url}/ui#/sessions/${wait}`)
    const facts = page.locator("#session-facts")
    await facts.getByText("position 1; 0/2 hosts have room: 2 ram_full (too big for any host: it waits for a bigger one)").waitFor()
    for (const id of [run, park, wait]) await api.del(`/v1/sessions/${id}`)
  })

  it("a session's page shows its events and acts: park, resume, a move within a budget, a refused move, end", async () => {
    const api = client(c.url, adminToken)
    const s = uid("acts")
    expect((await api.post("/v1/sessions", { id: s, memMib: 512, vcpus: 1, affinity: [big] })).status).toBe(201)
    expect((await api.post(`/v1/sessions/${s}/started`)).status).toBe(200)
    await signedIn(`#/sessions/${encodeURIComponent(s)}`)
    const events = page.locator("#session-events table.events")
    await expect.poll(async () => events.locator("tbody td:nth-child(3)").allTextContents(), { timeout: 120_000 }).toEqual(["created", "placed", "running"])
    const notice = page.locator("#notice")

    await page.getByRole("button", { name: "Park" }).click()
    await notice.getByText(`${s} parked: paused in RAM, resumes warm`).waitFor()
    await page.locator("#session-title .badge", { hasText: "parked" }).waitFor()
    expect((await api.get(`/v1/sessions/${s}`)).body.state).toBe("parked")

    await page.getByRole("button", { name: "Resume" }).click()
    await notice.getByText(`${s} resumed warm on ${big}: unparked where it was`).waitFor()
    expect((await api.get(`/v1/sessions/${s}`)).body.state).toBe("running")

    // A move without a named target goes only to a host that takes moves, and the form says so.
    expect(await page.locator("#move-target option").first().textContent()).toBe("the best-ranked host that takes moves")
    // A move within 700 ms to the small host; the source agent's part by hand over the API.
    await page.getByLabel("Downtime budget (ms)").fill("700")
    await page.getByLabel("Move to").selectOption(small)
    await page.getByRole("button", { name: "Move", exact: true }).click()
    await page.getByText(`Moving ${s} to ${small} within 700 ms`).waitFor()
    const move = await pendingMove(big, s)
    expect((await api.post(`/v1/moves/${move}/rounds`, { kind: "full", wireBytes: 64 << 20, apparentBytes: 512 << 20, sendMs: 300, captureMs: 40 })).status).toBe(200)
    await page.locator("#session-move .verdict", { hasText: "in progress: 1 round, last full" }).waitFor()
    expect(await page.locator("#move-committed-by").textContent()).toBe("-")
    expect((await api.post(`/v1/moves/${move}/rounds`, { kind: "final", wireBytes: 4 << 20, apparentBytes: 8 << 20, sendMs: 80, captureMs: 40 })).status).toBe(200)
    const guard = { allowanceMs: 400, allowanceSource: "prior", allowanceSamples: 0, estimateMs: 600 }
    expect((await api.post(`/v1/moves/${move}/commit`, { downtimeMs: 560, captureMs: 40, sendMs: 80, commitMs: 390, guard })).status).toBe(200)
    await notice.getByText(`${s} moved to ${small}: paused 560 ms (capture 40 ms · send 80 ms · commit 390 ms) within 700 ms`).waitFor()
    await page.locator("#session-move .verdict", { hasText: "committed: paused 560 ms" }).waitFor()
    expect(await page.locator("#session-move dd").first().textContent()).toBe(`${big} → ${small}`)
    expect(await page.locator("#session-move tbody tr").count()).toBe(2)
    // What the source's guard decided on, and how far off it was.
    expect(await page.locator("#move-allowance").textContent()).toBe("400 ms (the prior, ENGRAM_COMMIT_ALLOWANCE_MS: no recent commits of this host pair, too few into this target or anywhere); off by +10 ms against the commit")
    expect(await page.locator("#move-estimate").textContent()).toBe("600 ms; off by +40 ms against the pause")
    expect(await page.locator("#move-committed-by").textContent()).toBe("its source (phases measured)")

    // Moving back within 300 ms (no target named: the best-ranked other host that takes moves, as
    // each host's agent here advertises a peer URL): refused by the guard (the source's abort with its estimate).
    await page.getByLabel("Downtime budget (ms)").fill("300")
    await page.getByRole("button", { name: "Move", exact: true }).click()
    const back = await pendingMove(small, s)
    expect((await api.post(`/v1/moves/${back}/abort`, { reason: "estimate over budget", estimateMs: 812 })).status).toBe(200)
    await notice.getByText("Move: refused before the guest paused: estimate 812 ms > budget 300 ms; it keeps running on its host").waitFor()
    await page.locator("#session-move .verdict", { hasText: "refused: estimate 812 ms > budget 300 ms" }).waitFor()
    expect(await page.locator("#move-committed-by").textContent()).toBe("-")
    // A move without the guard's figures shows its pair's allowance now (the cases above may have moved between these hosts).
    // Asked for by target, the pair is listed even without commits of its own: it learns from recent commits once a pool holds 5, else the prior.
    const [pair] = (await api.get(`/v1/hosts/${small}/allowances?targetHostId=${big}`)).body.items as { targetHostId: string; allowanceMs: number; source: string; samples: number }[]
    expect(pair).toMatchObject({ targetHostId: big })
    const from: Record<string, string> = {
      prior: "the prior, ENGRAM_COMMIT_ALLOWANCE_MS: no recent commits of this host pair, too few into this target or anywhere",
      learned: `learned from the last ${pair!.samples} commits of this host pair`,
      target: `learned from ${pair!.samples} recent commits into this target: too few of this host pair`,
      fleet: `learned from ${pair!.samples} recent commits of the fleet: too few of this host pair or into this target`,
    }
    expect(from[pair!.source]).toBeDefined()
    expect(await page.locator("#move-allowance").textContent()).toBe(`${pair!.allowanceMs} ms now (${from[pair!.source]})`)
    expect(await page.locator("#move-estimate").count()).toBe(0)
    await expect.poll(async () => events.locator("tbody td:nth-child(3)").allTextContents(), { timeout: 120_000 }).toEqual(
      expect.arrayContaining(["parked", "resumed", "move_begun", "moved", "move_aborted"]),
    )

    // End asks once more before it acts.
    await page.getByRole("button", { name: "End", exact: true }).click()
    expect((await api.get(`/v1/sessions/${s}`)).body.state).toBe("running")
    await page.getByRole("button", { name: `Confirm: end ${s}` }).click()
    await notice.getByText(`${s} ended: its room is released`).waitFor()
    await page.locator("#session-title .badge", { hasText: "ended" }).waitFor()
    expect((await api.get(`/v1/sessions/${s}`)).body.state).toBe("ended")
    expect(await page.getByRole("button", { name: "End", exact: true }).count()).toBe(0)
    await expect.poll(async () => (await events.locator("tbody td:nth-child(3)").allTextContents()).at(-1), { timeout: 120_000 }).toBe("ended")
  })

  it("a host's card shows the templates it holds, and a session's page the template it starts from", async () => {
    const api = client(c.url, adminToken)
    const tpl = uid("tpl")
    expect((await api.put(`/v1/hosts/${small}/report`, { totalMib: 4096 + 1024, allocatableMib: 4096 + 1024, totalVcpus: 4, peerUrl: `http://${small}.test:7100`, templates: [{ name: tpl, memMib: 512, vcpus: 1 }] })).status).toBe(200)
    await signedIn("#/")
    await page.locator(`[data-host="${small}"] .figures.templates`, { hasText: `Templates: ${tpl} (512 MiB, 1 vCPU)` }).waitFor()
    expect(await page.locator(`[data-host="${big}"] .figures.templates`).textContent()).toBe("Templates: none")
    const s = uid("from-tpl")
    const created = await api.post("/v1/sessions", { id: s, memMib: 512, vcpus: 1, template: tpl })
    expect(created.status).toBe(201)
    // Placement prefers the template's holder.
    expect(created.body.hostId).toBe(small)
    await signedIn(`#/sessions/${encodeURIComponent(s)}`)
    // The last test's session page can still be on screen (it has a Template row too, "none
    // (boots)"): wait for this session's page, then for its facts to show the template.
    await page.locator("#session-title", { hasText: `Session ${s}` }).waitFor()
    const facts = page.locator("#session-facts")
    const template = facts.locator("dt:text-is('Template') + dd")
    await template.filter({ hasText: tpl }).waitFor()
    expect(await template.textContent()).toBe(tpl)
    await api.del(`/v1/sessions/${s}`)
    expect((await api.put(`/v1/hosts/${small}/report`, { totalMib: 4096 + 1024, allocatableMib: 4096 + 1024, totalVcpus: 4, peerUrl: `http://${small}.test:7100`, templates: [] })).status).toBe(200)
  })

  it("a host's card cordons, uncordons and drains it", async () => {
    const api = client(c.url, adminToken)
    await signedIn("#/")
    const card = page.locator(`[data-host="${small}"]`)
    await card.getByRole("button", { name: "Cordon" }).click()
    await page.locator("#notice", { hasText: `${small} cordoned: it takes no new sessions; what runs there stays` }).waitFor()
    await card.locator(".badge", { hasText: "cordoned" }).waitFor()
    expect((await api.get(`/v1/hosts/${small}`)).body.state).toBe("cordoned")
    await card.getByRole("button", { name: "Uncordon" }).click()
    await card.locator(".badge", { hasText: "ready" }).waitFor()
    expect((await api.get(`/v1/hosts/${small}`)).body.state).toBe("ready")
    await card.getByRole("button", { name: "Drain" }).click()
    await card.locator(".badge", { hasText: "draining" }).waitFor()
    expect((await api.get(`/v1/hosts/${small}`)).body.state).toBe("draining")
    await card.getByRole("button", { name: "Uncordon" }).click()
    await card.locator(".badge", { hasText: "ready" }).waitFor()
  })

  it("charts the free RAM, the queue and the parks over time from the coordinator's samples", async () => {
    const api = client(c.url, adminToken)
    // The samples are fleet data: the admin token only.
    expect((await fetch(`${c.url}/ui/history`)).status).toBe(401)
    expect((await api.get("/ui/history")).body).toMatchObject({ intervalMs: 100, samples: expect.any(Array) })
    await signedIn("#/")
    const queue = page.locator('[data-series="queue"]')
    await queue.locator("svg").waitFor()
    const waiting = uid("chart")
    const queuedBefore = (await api.get("/v1/fleet")).body.queue.sessions as number
    expect((await api.post("/v1/sessions", { id: waiting, memMib: 64 * 1024, vcpus: 1 })).status).toBe(202)
    // A sample taken after the create shows it (the page reads the history as the fleet changes).
    await queue.locator(".chart-now", { hasText: String(queuedBefore + 1) }).waitFor()
    const label = (await queue.locator("svg").getAttribute("aria-label")) ?? ""
    expect(label).toMatch(new RegExp(`^Queue: now ${queuedBefore + 1}; between [0-9]+ and ${queuedBefore + 1} over the last `))
    expect(Number(await queue.locator("svg").getAttribute("data-points"))).toBeGreaterThan(1)
    const free = (await api.get("/v1/fleet")).body.freeMib as number
    expect(await page.locator('[data-series="freeMib"] svg').getAttribute("aria-label")).toMatch(new RegExp(`^Free RAM: now ${free / 1024} GiB;`))
    expect(await page.locator('[data-series="parks"] .chart-title').textContent()).toBe("Parks")
    await api.del(`/v1/sessions/${waiting}`)
    await queue.locator(".chart-now", { hasText: String(queuedBefore) }).waitFor()
  })
})

describe("the API reference at /docs", { timeout: 300_000 }, () => {
  it("its curl samples send the bearer token, not Basic credentials", async () => {
    const docs = await browser.newPage()
    try {
      // Not "load": that waits for every script of Scalar's bundle; the poll below waits for what is drawn.
      await docs.goto(`${c.url}/docs`, { waitUntil: "domcontentloaded" })
      // The request sample of the first endpoint that needs a credential, once Scalar has drawn it.
      const sample = async () => /--header 'Authorization: [^']*'/.exec(await docs.locator("body").innerText())?.[0] ?? ""
      await expect.poll(sample, { timeout: 120_000 }).not.toBe("")
      expect(await sample()).toMatch(/^--header 'Authorization: Bearer \S+'$/)
      expect(await docs.locator("body").innerText()).not.toMatch(/Authorization: Basic/)
    } finally {
      await docs.close()
    }
  })
})
