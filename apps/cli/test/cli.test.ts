// The `engram` CLI as a real process against a real coordinator (in this process, on the
// in-memory store, over real HTTP): what a person reads, what a script reads (--json), the
// exit codes, and where the URL and the token come from.
import type { RunningCoordinator } from "@engram/coordinator"
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { createServer } from "node:http"
import type { ServerResponse } from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { addHost, adminToken, call, pendingMove, start, started, uid } from "./support/Fleet.js"
import { engram, runCommand } from "./support/Run.js"
import { dirname } from "node:path"

let c: RunningCoordinator
let env: Record<string, string>
const big = uid("big")
const small = uid("small")
const scratch = mkdtempSync(join(tmpdir(), "engram-cli-"))

beforeAll(async () => {
  c = await start()
  env = { ENGRAM_URL: c.url, ENGRAM_TOKEN: adminToken }
  await addHost(c.url, big, 8192, 8)
  await addHost(c.url, small, 4096, 4)
})
afterAll(async () => {
  await c?.stop()
  rmSync(scratch, { recursive: true, force: true })
})

const lines = (s: string) => s.trimEnd().split("\n")

describe("engram status and hosts", () => {
  it("status prints the fleet signal in GiB; --json prints the API's record", async () => {
    const r = await engram(["status"], { env })
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout).toMatch(/^hosts\s+2 \(2 ready, 0 cordoned, 0 draining; 2 measured\)$/m)
    expect(r.stdout).toMatch(/^RAM\s+12 GiB free of 12 GiB \(0 MiB reserved\)$/m)
    expect(r.stdout).toMatch(/^queue\s+empty$/m)
    const j = await engram(["status", "--json"], { env })
    expect(JSON.parse(j.stdout)).toMatchObject({ hosts: { total: 2, ready: 2 }, capacityMib: 12 * 1024 })
  })

  it("hosts ls is an aligned table with each host's room and how long ago it reported", async () => {
    const r = await engram(["hosts", "ls"], { env })
    expect(r.code, r.stderr).toBe(0)
    const [header, ...rows] = lines(r.stdout)
    expect(header).toMatch(/^HOST\s+STATE\s+RAM RESERVED\s+RAM FREE\s+VCPUS\s+VCPUS FREE\s+ENTRIES\s+PARKS\s+DESCENTS\s+REPORTED$/)
    const row = rows.find((l) => l.startsWith(big))
    expect(row).toMatch(/ready\s+0 MiB\/8 GiB\s+8 GiB\s+0\/32\s+32\s+0\s+0\s+0\s+[0-9.]+ ?[a-z]+ ago$/)
    // Aligned: every row's state column starts where the header's does.
    const at = header!.indexOf("STATE")
    for (const l of rows) expect(l.slice(at, at + 5)).toBe("ready")
  })

  it("hosts cordon, show and uncordon", async () => {
    expect((await engram(["hosts", "cordon", big], { env })).stdout).toBe(`${big} cordoned: it takes no new sessions; what runs there stays\n`)
    const shown = await engram(["hosts", "show", big], { env })
    expect(shown.stdout).toMatch(/^state\s+cordoned$/m)
    expect(shown.stdout).toMatch(/^RAM\s+0 MiB reserved of 8 GiB \(8 GiB free; reported 9 GiB allocatable\)$/m)
    expect(shown.stdout).toMatch(/^templates\s+-$/m)
    expect((await engram(["hosts", "uncordon", big], { env })).code).toBe(0)
    expect(JSON.parse((await engram(["hosts", "show", big, "--json"], { env })).stdout)).toMatchObject({ id: big, state: "ready" })
  })
})

describe("engram sessions and why", () => {
  it("create places a session; a session that fits nowhere queues, and why sums the hosts' reasons", async () => {
    const a = uid("a")
    const placed = await engram(["sessions", "create", "--mem", "1GiB", "--vcpus", "1", "--id", a], { env })
    expect(placed.stdout).toBe(`${a} placed on ${small} (pending)\n`)
    await engram(["hosts", "cordon", big], { env })
    const q = uid("q")
    try {
    const queued = await engram(["sessions", "create", "--mem", "3.5g", "--vcpus", "1", "--id", q], { env })
    expect(queued.code, queued.stderr).toBe(0)
    expect(queued.stdout).toBe(`${q} queued at position 1: 0/2 hosts have room: 1 ram_full, 1 cordoned. (engram why ${q})\n`)
    const why = await engram(["why", q], { env })
    expect(why.code, why.stderr).toBe(0)
    const out = lines(why.stdout)
    expect(out[0]).toMatch(new RegExp(`^${q} waits at position 1 of the queue for .+, for 3.5 GiB and 1 vCPU\\.$`))
    expect(out[1]).toBe("0/2 hosts have room: 1 ram_full, 1 cordoned")
    expect(why.stdout).toMatch(new RegExp(`^${big}\\s+cordoned\\s+8 GiB\\s+32\\s+cordoned: takes nothing new$`, "m"))
    expect(why.stdout).toMatch(new RegExp(`^${small}\\s+ram_full\\s+3 GiB\\s+15\\s+not enough free RAM$`, "m"))
    const wj = JSON.parse((await engram(["why", q, "--json"], { env })).stdout)
    expect(wj).toMatchObject({ id: q, state: "queued", summary: "0/2 hosts have room: 1 ram_full, 1 cordoned", queue: { position: 1 } })
    } finally {
      await call(c.url, "POST", `/v1/hosts/${big}/uncordon`)
    }
    for (const id of [a, q]) expect((await engram(["sessions", "end", id], { env })).stdout).toBe(`${id} ended\n`)
    // Ending again is no error: it says so, exit 0.
    const again = await engram(["sessions", "end", a], { env })
    expect([again.code, again.stdout, again.stderr]).toEqual([0, `${a} was already ended: nothing to do\n`, ""])
    expect((await engram(["why", a], { env })).stdout).toBe(`${a} is not waiting: it is ended\n`)
  })

  it("ls lists sessions by state; show, idle and end act on one", async () => {
    const s = uid("s")
    await engram(["sessions", "create", "--mem", "512", "--vcpus", "2", "--id", s, "--affinity", big], { env })
    await started(c.url, s)
    const ls = await engram(["sessions", "ls", "--state", "running"], { env })
    expect(lines(ls.stdout)[0]).toMatch(/^SESSION\s+STATE\s+HOST\s+MEM\s+VCPUS\s+FOR$/)
    expect(ls.stdout).toMatch(new RegExp(`^${s}\\s+running\\s+${big}\\s+512 MiB\\s+2\\s+\\S+`, "m"))
    expect((await engram(["sessions", "show", s], { env })).stdout).toMatch(/^budget\s+512 MiB, 2 vCPUs$/m)
    expect((await engram(["sessions", "idle", s], { env })).stdout).toBe(`${s} parked: paused in RAM, resumes warm\n`)
    const parked = JSON.parse((await engram(["sessions", "ls", "--state", "parked", "--json"], { env })).stdout) as { id: string }[]
    expect(parked.map((p) => p.id)).toContain(s)
    await engram(["sessions", "end", s], { env })
  })

  it("create --template stores the template, show prints it, and a bad name is refused naming template", async () => {
    const s = uid("t")
    // The small host reports the template (as its agent would): hosts show lists it.
    const reported = await call(c.url, "PUT", `/v1/hosts/${small}/report`, { totalMib: 5120, allocatableMib: 5120, totalVcpus: 4, templates: [{ name: "py-3.12", memMib: 512, vcpus: 1 }] })
    expect(reported.status).toBe(200)
    expect((await engram(["hosts", "show", small], { env })).stdout).toMatch(/^templates\s+py-3\.12 \(512 MiB, 1 vCPU\)$/m)
    await engram(["sessions", "create", "--mem", "512", "--vcpus", "1", "--id", s, "--template", "py-3.12"], { env })
    const shown = (await engram(["sessions", "show", s], { env })).stdout
    expect(shown).toMatch(/^template\s+py-3\.12$/m)
    expect(shown).toMatch(new RegExp(`^host\\s+${small}$`, "m"))
    const bad = await engram(["sessions", "create", "--mem", "512", "--vcpus", "1", "--template", ".hidden"], { env })
    expect(bad.code).not.toBe(0)
    expect(bad.stderr).toContain("template")
    await engram(["sessions", "end", s], { env })
  })

  it("--vcpus and --count take decimal digits only: 1e3 and 0x10 are refused, nothing is created", async () => {
    const before = (await call(c.url, "GET", "/v1/sessions?limit=1000")).body.items.length
    for (const v of ["1e3", "0x10", "2.0", "-1", "0"]) {
      const r = await engram(["sessions", "create", "--mem", "512", "--vcpus", v], { env })
      expect(r.code, v).not.toBe(0)
      expect(r.stderr, v).toMatch(/vcpus/)
      expect(r.stderr, v).toMatch(/a whole number above 0, in decimal digits/)
    }
    expect((await call(c.url, "GET", "/v1/sessions?limit=1000")).body.items.length).toBe(before)
    const watched = await engram(["watch", "--count", "1e0"], { env })
    expect(watched.code).not.toBe(0)
    expect(watched.stderr).toMatch(/a whole number above 0, in decimal digits/)
  })

  it("a move the guard refuses is one line with the estimate, exit 1", async () => {
    const s = uid("m")
    await engram(["sessions", "create", "--mem", "512", "--vcpus", "1", "--id", s, "--affinity", small], { env })
    await started(c.url, s)
    const moving = engram(["sessions", "move", s, "--max-downtime", "300ms", "--to", big], { env })
    const move = await pendingMove(c.url, small, s)
    await call(c.url, "POST", `/v1/moves/${move.id}/abort`, { reason: "estimate over budget", estimateMs: 812 })
    const r = await moving
    expect(r.code).toBe(1)
    expect(r.stdout).toBe("")
    expect(r.stderr).toBe("engram: move refused for downtime (estimate 812 ms > budget 300 ms): the session keeps running on its source\n")
    await engram(["sessions", "end", s], { env })
  })

  it("a move committed on a resolution prints that its pause was not measured, exit 0; --json prints the API's answer", async () => {
    const final = { kind: "final", wireBytes: 1000, apparentBytes: 1000, sendMs: 1, captureMs: 1 }
    const s = uid("r")
    await engram(["sessions", "create", "--mem", "512", "--vcpus", "1", "--id", s, "--affinity", small], { env })
    await started(c.url, s)
    const moving = engram(["sessions", "move", s, "--max-downtime", "600ms", "--to", big], { env })
    const move = await pendingMove(c.url, small, s)
    expect((await call(c.url, "POST", `/v1/moves/${move.id}/rounds`, final)).status).toBe(200)
    expect((await call(c.url, "POST", `/v1/moves/${move.id}/resolve`, { outcome: "commit", reason: "the target runs the guest" })).status).toBe(200)
    // Before: exit 1, "engram: aborted", for a move that committed.
    const r = await moving
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout).toBe(`${s} moved to ${big}: committed on a resolution (its target's report or an operator's word); its pause was not measured\n`)
    // The admin's resolve: an operator's commit, as moves show and ls say.
    expect((await engram(["moves", "show", move.id], { env })).stdout).toMatch(/^committed by\s+an operator \(engram moves commit\)$/m)
    // Back again, as a script reads it.
    const back = engram(["sessions", "move", s, "--max-downtime", "600ms", "--to", small, "--json"], { env })
    const again = await pendingMove(c.url, big, s)
    expect((await call(c.url, "POST", `/v1/moves/${again.id}/rounds`, final)).status).toBe(200)
    expect((await call(c.url, "POST", `/v1/moves/${again.id}/resolve`, { outcome: "commit", reason: "the target runs the guest" })).status).toBe(200)
    const j = await back
    expect(j.code, j.stderr).toBe(0)
    expect(JSON.parse(j.stdout)).toMatchObject({ move: { id: again.id, state: "committed", phases: null }, downtimeMs: null, captureMs: null, sendMs: null, commitMs: null })
    await engram(["sessions", "end", s], { env })
  })

  it("moves show and ls say who committed a move: its target's resolution (the target host's token), apart from an operator's; none while pending", async () => {
    // A target whose token the test holds, as its agent would.
    const target = uid("t")
    const created = await call(c.url, "POST", "/v1/hosts", { id: target })
    expect(created.status).toBe(201)
    expect((await call(c.url, "PUT", `/v1/hosts/${target}/report`, { totalMib: 5120, allocatableMib: 5120, totalVcpus: 4 })).status).toBe(200)
    const s = uid("t")
    await engram(["sessions", "create", "--mem", "512", "--vcpus", "1", "--id", s, "--affinity", small], { env })
    await started(c.url, s)
    const moving = engram(["sessions", "move", s, "--max-downtime", "600ms", "--to", target], { env })
    const move = await pendingMove(c.url, small, s)
    expect((await engram(["moves", "show", move.id], { env })).stdout).not.toMatch(/^committed by/m)
    expect((await call(c.url, "POST", `/v1/moves/${move.id}/rounds`, { kind: "final", wireBytes: 1000, apparentBytes: 1000, sendMs: 1, captureMs: 1 })).status).toBe(200)
    const resolved = await fetch(`${c.url}/v1/moves/${move.id}/resolve`, {
      method: "POST",
      headers: { authorization: `Bearer ${created.body.token as string}`, "content-type": "application/json" },
      body: JSON.stringify({ outcome: "commit", reason: "the target runs the guest" }),
    })
    expect(resolved.status).toBe(200)
    expect((await moving).code).toBe(0)
    const shown = await engram(["moves", "show", move.id], { env })
    expect(shown.code, shown.stderr).toBe(0)
    expect(shown.stdout).toMatch(/^committed by\s+its target's resolution \(it runs the guest\)$/m)
    const row = lines((await engram(["moves", "ls", "--host", target], { env })).stdout).find((l) => l.startsWith(move.id))
    expect(row).toMatch(/\scommitted\s+target\s+-\s+-$/)
    expect(JSON.parse((await engram(["moves", "show", move.id, "--json"], { env })).stdout)).toMatchObject({ id: move.id, committedBy: "target" })
    await engram(["sessions", "end", s], { env })
    // The fleet as the other tests of the file count it (two hosts): the target goes.
    const removed = await engram(["hosts", "rm", target], { env })
    expect(removed.code, removed.stderr).toBe(0)
  })

  it("moves show prints the pause by phase and the guard's allowance and estimate with their errors; hosts allowances shows the learned allowance per target", async () => {
    const s = uid("g")
    await engram(["sessions", "create", "--mem", "512", "--vcpus", "1", "--id", s, "--affinity", small], { env })
    await started(c.url, s)
    const moving = engram(["sessions", "move", s, "--max-downtime", "5s", "--to", big], { env })
    const move = await pendingMove(c.url, small, s)
    // The source agent's last two calls, its guard's figures with the commit.
    await call(c.url, "POST", `/v1/moves/${move.id}/rounds`, { kind: "final", wireBytes: 1000, apparentBytes: 2000, sendMs: 10, captureMs: 5 })
    const guard = { allowanceMs: 400, allowanceSource: "prior", allowanceSamples: 0, estimateMs: 520 }
    const committed = await call(c.url, "POST", `/v1/moves/${move.id}/commit`, { downtimeMs: 480, captureMs: 40, sendMs: 90, commitMs: 350, guard })
    expect(committed.status, JSON.stringify(committed.body)).toBe(200)
    expect((await moving).code).toBe(0)
    const shown = await engram(["moves", "show", move.id], { env })
    expect(shown.code, shown.stderr).toBe(0)
    expect(shown.stdout).toMatch(/^paused\s+480 ms \(capture 40 ms, send 90 ms, commit 350 ms\)$/m)
    expect(shown.stdout).toMatch(/^committed by\s+its source \(phases measured\)$/m)
    expect(shown.stdout).toMatch(/^allowance\s+400 ms: the prior \(no recent commits between these hosts, too few into the target or anywhere\); off by \+50 ms against the commit$/m)
    expect(shown.stdout).toMatch(/^estimate\s+520 ms; off by \+40 ms against the pause$/m)
    const j = JSON.parse((await engram(["moves", "show", move.id, "--json"], { env })).stdout)
    expect(j.guard).toEqual({ ...guard, estimateErrorMs: 40, allowanceErrorMs: 50 })
    const allowances = await engram(["hosts", "allowances", small], { env })
    expect(allowances.code, allowances.stderr).toBe(0)
    expect(allowances.stdout).toMatch(new RegExp(`^${big}\\s+350 ms\\s+learned\\s+1\\s+350$`, "m"))
    expect(allowances.stdout).toMatch(/^commits older than \S+ \S+ no longer count; a pair with too few recent ones learns from its target's, then the fleet's \(a pool counts from 5\); else the prior, 400 ms$/m)
    await engram(["sessions", "end", s], { env })
  })

  it("a move whose source owes a resend: moves show and ls say that the source holds the only copy and owes the stream, and a commit or abort of it says why it is refused", async () => {
    const s = uid("o")
    await engram(["sessions", "create", "--mem", "512", "--vcpus", "1", "--id", s, "--affinity", small], { env })
    await started(c.url, s)
    const moving = engram(["sessions", "move", s, "--max-downtime", "600ms", "--to", big], { env })
    const move = await pendingMove(c.url, small, s)
    expect((await call(c.url, "POST", `/v1/moves/${move.id}/rounds`, { kind: "final", wireBytes: 1000, apparentBytes: 1000, sendMs: 1, captureMs: 1 })).status).toBe(200)
    const committed = await engram(["moves", "commit", move.id, "--reason", "the source is unreachable"], { env })
    expect([committed.code, committed.stdout]).toEqual([0, `${move.id} committed: ${s} runs on ${big}\n`])
    expect((await moving).code).toBe(0)
    const row = () => engram(["moves", "ls", "--host", small, "--state", "committed"], { env }).then((r) => lines(r.stdout).find((l) => l.startsWith(move.id)))
    expect(lines((await engram(["moves", "ls"], { env })).stdout)[0]).toMatch(/^MOVE\s+SESSION\s+FROM\s+TO\s+STATE\s+BY\s+FINAL ROUND\s+RESEND$/)
    expect(await row()).toMatch(/\scommitted\s+operator\s+-\s+-$/)
    expect((await engram(["moves", "show", move.id], { env })).stdout).not.toMatch(/^resend/m)
    // The source's agent: the target never got a complete stream, its copy is the only one.
    expect((await call(c.url, "POST", `/v1/moves/${move.id}/resend`, { owed: true })).status).toBe(200)
    const shown = await engram(["moves", "show", move.id], { env })
    expect(shown.code, shown.stderr).toBe(0)
    expect(shown.stdout).toMatch(/^resend\s+owed: the source holds the only copy of the guest \(paused\) and owes the target the stream; should the target die while this is set \(the source sets it again whenever the target answers that it runs nothing\), the session goes back to the source$/m)
    expect(await row()).toMatch(/\scommitted\s+operator\s+-\s+owed: source holds the only copy$/)
    expect(JSON.parse((await engram(["moves", "show", move.id, "--json"], { env })).stdout)).toMatchObject({ id: move.id, state: "committed", resendOwed: true })
    for (const outcome of ["commit", "abort"]) {
      const refused = await engram(["moves", outcome, move.id, "--reason", "stuck"], { env })
      expect(refused.code, outcome).not.toBe(0)
      expect(refused.stderr, outcome).toContain(`Move ${move.id} is committed and its source owes a resend: it holds the only copy of the guest (paused) and owes ${big} the stream`)
      expect(refused.stderr, outcome).toContain("Nothing to commit or abort")
    }
    // Settled: the mark is gone from both views, and a refused resolution says only what it said before.
    expect((await call(c.url, "POST", `/v1/moves/${move.id}/resend`, { owed: false })).status).toBe(200)
    expect((await engram(["moves", "show", move.id], { env })).stdout).not.toMatch(/^resend/m)
    expect(await row()).toMatch(/\scommitted\s+operator\s+-\s+-$/)
    expect((await engram(["moves", "abort", move.id, "--reason", "stuck"], { env })).stderr).not.toContain("owes a resend")
    await engram(["sessions", "end", s], { env })
  })

  it("reservations ls lists the ledger; add holds room for an outside job and rm gives it back", async () => {
    const id = uid("r")
    const added = await engram(["reservations", "add", "--host", big, "--mem", "2GiB", "--vcpus", "2", "--owner", "job-7", "--id", id], { env })
    expect(added.code, added.stderr).toBe(0)
    expect(added.stdout).toBe(`${id} holds 2 GiB and 2 vCPUs on ${big} for job-7, until released (engram reservations rm ${id})\n`)
    const r = await engram(["reservations", "ls", "--host", big], { env })
    expect(r.code, r.stderr).toBe(0)
    expect(lines(r.stdout)[0]).toMatch(/^RESERVATION\s+HOST\s+OWNER\s+MEM\s+VCPUS\s+HEARTBEAT\s+EXPIRES$/)
    expect(r.stdout).toMatch(new RegExp(`^${id}\\s+${big}\\s+external:job-7\\s+2 GiB\\s+2\\s+(\\d+ ms|\\d+s|\\d+m \\d\\ds) ago\\s+-$`, "m"))
    expect((await engram(["reservations", "show", id], { env })).stdout).toMatch(new RegExp(`^${id}\\s+${big}\\s+external:job-7`, "m"))
    const expiring = await engram(["reservations", "add", "--host", big, "--mem", "512", "--vcpus", "1", "--owner", "ci", "--expires", "10m", "--json"], { env })
    const held = JSON.parse(expiring.stdout) as { id: string; expiresAt: number }
    expect(held.expiresAt - Date.now()).toBeGreaterThan(9 * 60_000)
    expect((await engram(["reservations", "rm", id], { env })).stdout).toBe(`${id} released: 2 GiB free again on ${big}\n`)
    await engram(["reservations", "rm", held.id], { env })
    expect((await call(c.url, "GET", `/v1/reservations/${id}`)).status).toBe(404)
  })

  it("status names sessions too big for any host (unplaceable), the cue for a bigger host", async () => {
    const huge = uid("huge")
    await engram(["sessions", "create", "--mem", "64GiB", "--vcpus", "1", "--id", huge], { env })
    try {
      const r = await engram(["status"], { env })
      expect(r.code, r.stderr).toBe(0)
      expect(r.stdout).toMatch(/^unplaceable\s+1 too big for any host even empty \(largest 64 GiB, 1 vCPU\): add a bigger host$/m)
      expect(JSON.parse((await engram(["status", "--json"], { env })).stdout)).toMatchObject({ unplaceable: { count: 1, largestMemMib: 65536, largestVcpus: 1 } })
    } finally {
      await engram(["sessions", "end", huge], { env })
    }
  })

  it("watch prints a frame per refresh and stops after --count", async () => {
    const r = await engram(["watch", "--count", "2", "--interval", "10ms"], { env })
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout.match(/^engram {2}\d\d:\d\d:\d\d {2}hosts \d+\/\d+ ready/gm)).toHaveLength(2)
    const j = await engram(["watch", "--count", "1", "--json"], { env })
    expect(JSON.parse(j.stdout)).toMatchObject({ fleet: { hosts: { total: 2 } }, hosts: expect.any(Array), queue: expect.any(Array) })
  })
})

describe("errors and usage", () => {
  it("bad input is one line naming the field and the rule, exit 1, and creates nothing", async () => {
    const r = await engram(["sessions", "create", "--mem", "512", "--vcpus", "1", "--id", "bad id"], { env })
    expect(r.code).toBe(1)
    expect(r.stderr).toMatch(/^engram: invalid input: id .+\n$/)
    expect(lines(r.stderr)).toHaveLength(1)
    expect((await call(c.url, "GET", "/v1/sessions/bad%20id")).status).toBe(404)
  })

  it("a bad flag value is one line naming the flag, exit 2", async () => {
    const rule = "a RAM size above 0 in MiB, GiB or TiB (1024-based; MB/GB are not taken): 1024 (MiB), 512MiB, 1GiB or 1.5g"
    const r = await engram(["sessions", "create", "--mem", "lots", "--vcpus", "1"], { env })
    expect(r.code).toBe(2)
    expect(r.stderr).toBe(`engram: Invalid value for flag --mem: "lots". Expected: ${rule} (see: engram sessions create --help)\n`)
    // A negative size after a space: the flag's rule, not "Missing value for flag --mem" (the lexer took -1GiB for flags).
    const negative = await engram(["sessions", "create", "--mem", "-1GiB", "--vcpus", "1"], { env })
    expect([negative.code, negative.stderr]).toEqual([2, `engram: Invalid value for flag --mem: "-1GiB". Expected: ${rule} (see: engram sessions create --help)\n`])
    // 1GB is not taken as 1 GiB silently: nothing is created.
    const before = (await call(c.url, "GET", "/v1/fleet")).body as { reservedMib: number }
    const gb = await engram(["sessions", "create", "--mem", "1GB", "--vcpus", "1"], { env })
    expect([gb.code, gb.stderr]).toEqual([2, `engram: Invalid value for flag --mem: "1GB". Expected: ${rule} (see: engram sessions create --help)\n`])
    expect(((await call(c.url, "GET", "/v1/fleet")).body as { reservedMib: number }).reservedMib).toBe(before.reservedMib)
  })

  it("watch --count below 1 is refused naming the flag, exit 2 (it printed nothing and succeeded)", async () => {
    for (const count of ["0", "-3"]) {
      const r = await engram(["watch", "--count", count], { env })
      expect([r.code, r.stdout], count).toEqual([2, ""])
      expect(r.stderr).toBe(`engram: Invalid value for flag --count: "${count}". Expected: a whole number above 0, in decimal digits (see: engram watch --help)\n`)
    }
  })

  it("an unknown session, a wrong token and an unreachable coordinator each say so in one line, exit 1", async () => {
    const nf = await engram(["sessions", "show", "nope"], { env })
    expect([nf.code, nf.stderr]).toEqual([1, "engram: session nope not found\n"])
    const wrong = await engram(["status", "--token", "wrong-wrong-wrong-wrong"], { env: { ENGRAM_URL: c.url } })
    expect(wrong.code).toBe(1)
    expect(wrong.stderr).toBe(`engram: the coordinator at ${c.url} refused the token from --token: invalid bearer token\n`)
    const away = await engram(["status", "--url", "http://127.0.0.1:9"], { env })
    expect(away.code).toBe(1)
    expect(away.stderr).toMatch(/^engram: cannot reach the coordinator at http:\/\/127\.0\.0\.1:9: .*Is the coordinator running \(pnpm start\)\? Or point --url \/ ENGRAM_URL at it\.\n$/)
  })

  it("the token is found in .engram/admin-token above the working directory; without one the CLI says where to put it", async () => {
    const root = join(scratch, "repo")
    mkdirSync(join(root, ".engram"), { recursive: true })
    mkdirSync(join(root, "a", "b"), { recursive: true })
    writeFileSync(join(root, ".engram", "admin-token"), `${adminToken}\n`, { mode: 0o600 })
    const found = await engram(["status", "--json"], { env: { ENGRAM_URL: c.url }, cwd: join(root, "a", "b") })
    expect(found.code, found.stderr).toBe(0)
    expect(JSON.parse(found.stdout)).toMatchObject({ hosts: { total: 2 } })
    const none = await engram(["status"], { env: { ENGRAM_URL: c.url }, cwd: scratch })
    expect(none.code).toBe(2)
    expect(none.stderr).toMatch(/^engram: no token: pass --token, set ENGRAM_TOKEN, or run where the coordinator wrote \.engram\/admin-token/)
  })

  it("--completions prints a shell completion script", async () => {
    const r = await engram(["--completions", "bash"], { env })
    expect(r.code).toBe(0)
    expect(r.stdout).toContain("engram")
    expect(r.stdout).toContain("complete")
  })
})

describe("pnpm engram at the repository root", () => {
  it("pnpm engram -- status --json runs the CLI from source and prints the fleet", async () => {
    const root = join(dirname(new URL(import.meta.url).pathname), "..", "..", "..")
    const r = await runCommand("pnpm", ["engram", "--", "status", "--json"], { env: { ENGRAM_URL: c.url, ENGRAM_TOKEN: adminToken }, cwd: root })
    expect(r.code, r.stderr).toBe(0)
    expect(JSON.parse(r.stdout)).toMatchObject({ hosts: { total: 2 } })
  })
})

describe("the lifecycle commands", () => {
  it("resume says warm for a parked session; wait answers once the state is reached; events lists the history", async () => {
    const s = uid("w")
    await engram(["sessions", "create", "--mem", "512", "--vcpus", "1", "--id", s], { env })
    const waiting = engram(["sessions", "wait", s, "--state", "running", "--timeout", "30s"], { env })
    await started(c.url, s)
    const waited = await waiting
    expect(waited.stdout).toMatch(new RegExp(`^${s} is running on \\S+\n$`))
    await engram(["sessions", "idle", s], { env })
    const resumed = await engram(["sessions", "resume", s], { env })
    expect(resumed.stdout).toMatch(new RegExp(`^${s} resumed warm on \\S+ \\(running\\): unparked where it was\n$`))
    const timedOut = await engram(["sessions", "wait", s, "--state", "parked", "--timeout", "50ms"], { env })
    expect(timedOut.code).toBe(1)
    expect(lines(timedOut.stderr)).toHaveLength(1)
    const events = await engram(["sessions", "events", s], { env })
    expect(lines(events.stdout)[0]).toMatch(/^SEQ\s+AT\s+EVENT\s+HOST\s+DETAILS$/)
    expect(events.stdout).toMatch(/\screated\s/)
    await engram(["sessions", "end", s], { env })
  })

  it("events lists the whole history, past the first page", async () => {
    const s = uid("long")
    expect((await call(c.url, "POST", "/v1/sessions", { id: s, memMib: 512, vcpus: 1 })).status).toBe(201)
    await started(c.url, s)
    // More events than one page of the CLI's (500): each idle and resume is one.
    for (let i = 0; i < 260; i++) {
      expect((await call(c.url, "POST", `/v1/sessions/${s}/idle`)).status).toBe(200)
      expect((await call(c.url, "POST", `/v1/sessions/${s}/resume`)).status).toBe(200)
    }
    const all = await call(c.url, "GET", `/v1/sessions/${s}/events?limit=1000`)
    expect(all.body.items.length).toBeGreaterThan(520)
    const listed = await engram(["sessions", "events", s], { env })
    expect(listed.code, listed.stderr).toBe(0)
    const rows = lines(listed.stdout).slice(1)
    expect(rows).toHaveLength(all.body.items.length)
    expect(rows.at(-1)).toMatch(new RegExp(`^${all.body.items.at(-1).seq}\\s`))
    const json = JSON.parse((await engram(["sessions", "events", s, "--json"], { env })).stdout)
    expect(json.items).toHaveLength(all.body.items.length)
    expect(json.nextCursor).toBeNull()
    await call(c.url, "DELETE", `/v1/sessions/${s}`)
  })

  it("hosts add registers a host and prints its agent's token once; rm refuses a host that holds reservations; rotate-token prints the new token", async () => {
    const added = uid("added")
    const r = await engram(["hosts", "add", added, "--label", "rack=r7", "--label", "zone=b"], { env })
    expect(r.code, r.stderr).toBe(0)
    const [token, hint] = lines(r.stdout)
    expect(token).toMatch(/^\S{16,}$/)
    expect(hint).toBe(`(the token of ${added}: start its agent with ENGRAM_HOST_ID=${added} and ENGRAM_HOST_TOKEN set to it; it is not shown again); it takes sessions once its agent reports`)
    expect((await call(c.url, "GET", `/v1/hosts/${added}`)).body).toMatchObject({ id: added, labels: { rack: "r7", zone: "b" }, measured: false })
    // The printed token is the host's own credential.
    expect((await fetch(`${c.url}/v1/hosts/${added}/assignments?waitMs=0`, { headers: { authorization: `Bearer ${token}` } })).status).toBe(200)
    const twice = await engram(["hosts", "add", added], { env })
    expect([twice.code, twice.stderr]).toEqual([1, `engram: host ${added} is already registered (engram hosts rotate-token ${added} gives its agent a new token)\n`])
    expect((await engram(["hosts", "rm", added], { env })).code).toBe(0)

    const h = uid("h")
    await addHost(c.url, h, 2048, 2)
    const s = uid("s")
    await engram(["sessions", "create", "--mem", "256", "--vcpus", "1", "--id", s, "--affinity", h], { env })
    const refused = await engram(["hosts", "rm", h], { env })
    expect(refused.code).toBe(1)
    await engram(["sessions", "end", s], { env })
    // The text output says the running agent stops at once and how long it has to come back.
    const rotatedText = await engram(["hosts", "rotate-token", h], { env })
    expect(rotatedText.code, rotatedText.stderr).toBe(0)
    expect(lines(rotatedText.stdout)[2]).toBe(
      `warning: the agent running on ${h} is refused at once (401) and stops (exit 3); restart it with the new token within the heartbeat stale window (the coordinator's ENGRAM_HEARTBEAT_STALE_WINDOW_MS, default 120000 ms: 2 min), or its sessions are reclaimed as stale and lost`,
    )
    const rotated = await engram(["hosts", "rotate-token", h, "--json"], { env })
    expect(JSON.parse(rotated.stdout)).toMatchObject({ id: h, token: expect.any(String) })
    expect((await engram(["hosts", "rm", h], { env })).stdout).toBe(`${h} removed\n`)
  })
})

/** A real HTTP server answering every request with `status` and `body`; its URL and how many requests it had. */
const answering = async (status: number, body: unknown) => {
  let requests = 0
  const server = createServer((_req, res) => {
    requests++
    res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body))
  })
  await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok))
  const port = (server.address() as AddressInfo).port
  return { url: `http://127.0.0.1:${port}`, requests: () => requests, close: () => new Promise<void>((ok) => server.close(() => ok())) }
}

describe("several coordinator URLs (replicas)", () => {
  it("ENGRAM_URL and --url take a comma list: a replica that refuses connections or answers 503 Unavailable (shutting down) is skipped", async () => {
    // A port nothing listens on: a privileged one no test binds (a server's port from
    // `listen(0)`, closed, could be handed to another test's server meanwhile).
    const gone = { url: "http://127.0.0.1:1" }
    const stopping = await answering(503, { error: "Unavailable", message: "the coordinator is shutting down; retry", retryAfterMs: 1000 })
    try {
      const r = await engram(["status", "--json"], { env: { ENGRAM_TOKEN: adminToken, ENGRAM_URL: `${gone.url},${stopping.url}, ${c.url}` } })
      expect(r.code, r.stderr).toBe(0)
      expect(JSON.parse(r.stdout)).toMatchObject({ hosts: { total: expect.any(Number) } })
      expect(stopping.requests()).toBe(1)
      const flag = await engram(["hosts", "ls", "--url", `${gone.url},${c.url}`], { env: { ENGRAM_TOKEN: adminToken } })
      expect(flag.code, flag.stderr).toBe(0)
      expect(flag.stdout).toMatch(/^HOST\s+STATE/)
      // Every replica away: one line naming them all.
      const none = await engram(["status"], { env: { ENGRAM_TOKEN: adminToken, ENGRAM_URL: `${gone.url},http://127.0.0.1:9` } })
      expect(none.code).toBe(1)
      expect(none.stderr).toMatch(new RegExp(`^engram: cannot reach the coordinator at .* \\(tried each of ${gone.url.replace(/[.]/g, "\\.")}, http://127\\.0\\.0\\.1:9\\)\\. Is the coordinator running`))
    } finally {
      await stopping.close()
    }
  })

  it("a create without --id carries an id the CLI chose: a replica that stored it but lost its answer (503) is followed by the next, which answers the same session, never a second", async () => {
    // A replica that does the create on the real coordinator and then loses the answer: a 503
    // `Unavailable`, as one whose store call timed out after the write committed would give.
    const seenIds: string[] = []
    const lossy = createServer((req, res) => {
      let body = ""
      req.on("data", (chunk: Buffer) => (body += chunk.toString()))
      req.on("end", () => {
        seenIds.push(String((JSON.parse(body === "" ? "{}" : body) as { id?: unknown }).id))
        void fetch(`${c.url}${req.url ?? "/"}`, { method: req.method ?? "POST", headers: { authorization: String(req.headers.authorization), "content-type": "application/json" }, body }).then(() =>
          res
            .writeHead(503, { "content-type": "application/json" })
            .end(JSON.stringify({ error: "Unavailable", message: "the database did not answer createSession within 15000 ms; a write's outcome is unknown until read back", retryAfterMs: 1000 })),
        )
      })
    })
    await new Promise<void>((ok) => lossy.listen(0, "127.0.0.1", ok))
    const lossyUrl = `http://127.0.0.1:${(lossy.address() as AddressInfo).port}`
    try {
      const env = { ENGRAM_TOKEN: adminToken }
      const count = async () => {
        const listed = JSON.parse((await engram(["sessions", "ls", "--json"], { env: { ...env, ENGRAM_URL: c.url } })).stdout) as unknown
        return (Array.isArray(listed) ? listed : ((listed as { items?: unknown[] }).items ?? [])).length
      }
      const before = await count()
      const r = await engram(["sessions", "create", "--mem", "256MiB", "--vcpus", "1", "--json"], { env: { ...env, ENGRAM_URL: `${lossyUrl},${c.url}` } })
      expect(r.code, r.stderr).toBe(0)
      expect(seenIds).toHaveLength(1)
      expect(seenIds[0]).toMatch(/^[0-9a-f-]{36}$/)
      expect((JSON.parse(r.stdout) as { id: string }).id).toBe(seenIds[0])
      expect(await count()).toBe(before + 1)
    } finally {
      await new Promise<void>((ok) => lossy.close(() => ok()))
    }
  })

  it("the coordinator's own answer is not retried on another replica (a 401 there is the answer)", async () => {
    const refusing = await answering(401, { error: "Unauthorized", message: "unknown token" })
    try {
      const r = await engram(["status"], { env: { ENGRAM_TOKEN: adminToken, ENGRAM_URL: `${refusing.url},${c.url}` } })
      expect(r.code).toBe(1)
      expect(r.stderr).toMatch(/refused the token from ENGRAM_TOKEN: unknown token/)
      expect(refusing.requests()).toBe(1)
    } finally {
      await refusing.close()
    }
  })

  it("a URL that breaks the rule is a usage error naming the setting and the rule, before any call", async () => {
    const bare = await engram(["status"], { env: { ENGRAM_TOKEN: adminToken, ENGRAM_URL: "127.0.0.1:17181" } })
    expect([bare.code, bare.stderr]).toEqual([
      2,
      'engram: ENGRAM_URL "127.0.0.1:17181": must be one or more absolute http:// or https:// URLs, comma-separated ("127.0.0.1:17181" is not one)\n',
    ])
    const flag = await engram(["status", "--url", "http://a:1,,http://b:2"], { env: { ENGRAM_TOKEN: adminToken } })
    expect([flag.code, flag.stderr]).toEqual([2, 'engram: --url "http://a:1,,http://b:2": must be one or more absolute http:// or https:// URLs, comma-separated, none empty\n'])
  })

  it("ENGRAM_TIMEOUT_MS bounds a try on a replica that hangs (see @engram/client's hung.test.ts); a value that breaks the rule is a usage error", async () => {
    for (const bad of ["0", "1.5", "30s", "-1"]) {
      const r = await engram(["status"], { env: { ENGRAM_TOKEN: adminToken, ENGRAM_URL: c.url, ENGRAM_TIMEOUT_MS: bad } })
      expect([r.code, r.stderr]).toEqual([2, `engram: ENGRAM_TIMEOUT_MS ${JSON.stringify(bad)}: must be an integer > 0 (ms)\n`])
    }
    const ok = await engram(["status", "--json"], { env: { ENGRAM_TOKEN: adminToken, ENGRAM_URL: c.url, ENGRAM_TIMEOUT_MS: "60000" } })
    expect(ok.code, ok.stderr).toBe(0)
  })

  it("a replica that hung is tried last by the next commands: a frozen first replica costs one timeout, not one a command", async () => {
    let requests = 0
    const held: ServerResponse[] = []
    const server = createServer((_req, res) => void (requests++, held.push(res)))
    await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok))
    const frozen = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
    const state = join(scratch, "state-hung")
    const replicas = { ENGRAM_TOKEN: adminToken, ENGRAM_URL: `${frozen},${c.url}`, ENGRAM_TIMEOUT_MS: "300", XDG_STATE_HOME: state }
    try {
      const first = await engram(["status", "--json"], { env: replicas })
      expect(first.code, first.stderr).toBe(0)
      expect(requests).toBe(1)
      for (const args of [["status"], ["hosts", "ls"]]) expect((await engram(args, { env: replicas })).code).toBe(0)
      // Answered by the live replica first: the frozen one was not asked again.
      expect(requests).toBe(1)
      expect(Object.keys(JSON.parse(readFileSync(join(state, "engram", "hung-replicas.json"), "utf8")))).toEqual([frozen])
    } finally {
      for (const res of held) res.destroy()
      await new Promise<void>((ok) => server.close(() => ok()))
    }
  })

  it("replicas that take the connection and never answer: the error names the replicas tried and says they hung, not that the coordinator may not be running", async () => {
    // Servers that read each request and never answer (frozen replicas).
    const held: ServerResponse[] = []
    const hanging = async () => {
      const server = createServer((_req, res) => void held.push(res))
      await new Promise<void>((ok) => server.listen(0, "127.0.0.1", ok))
      return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` }
    }
    const one = await hanging()
    const two = await hanging()
    try {
      const r = await engram(["status"], { env: { ENGRAM_TOKEN: adminToken, ENGRAM_URL: `${one.url},${two.url}`, ENGRAM_TIMEOUT_MS: "300" } })
      expect([r.code, r.stderr]).toEqual([
        1,
        `engram: cannot reach the coordinator at ${two.url}: no answer within 300 ms (tried each of ${one.url}, ${two.url}). The coordinator took the connection but did not answer in time: it is frozen or overloaded (look at its /readyz and its log), or the call needs longer (ENGRAM_TIMEOUT_MS).\n`,
      ])
    } finally {
      for (const res of held) res.destroy()
      await new Promise<void>((ok) => one.server.close(() => ok()))
      await new Promise<void>((ok) => two.server.close(() => ok()))
    }
  })
})

describe("silent hosts", () => {
  // A coordinator's answers, by hand: the coordinator's own side is tested over HTTP in its package (silent-view.test.ts).
  const host = (id: string, silent?: boolean) => ({
    id,
    labels: {},
    state: "ready",
    measured: true,
    report: { totalMib: 9216, allocatableMib: 9216, totalVcpus: 4, templates: [] },
    reportedAt: Date.now() - 10 * 60_000,
    createdAt: 0,
    peerUrl: null,
    ...(silent === undefined ? {} : { silent }),
    allocatableMib: 8192,
    reportedAllocatableMib: 9216,
    reservedMib: 0,
    freeMib: 8192,
    cpuBudget: 16,
    reservedVcpus: 0,
    freeVcpus: 16,
    entries: 0,
    parks: 0,
    descentsRunning: 0,
  })

  it("hosts ls shows a silent host's state as `ready, silent`; hosts show says why; an older coordinator's host (no flag) shows its state alone", async () => {
    const page = await answering(200, { items: [host("h-dead", true), host("h-live", false), host("h-old")], nextCursor: null })
    try {
      const r = await engram(["hosts", "ls"], { env: { ENGRAM_TOKEN: adminToken, ENGRAM_URL: page.url } })
      expect(r.code, r.stderr).toBe(0)
      const [header, ...rows] = lines(r.stdout)
      const at = header!.indexOf("STATE")
      expect(rows.map((l) => [l.slice(0, at).trim(), l.slice(at).split(/\s{2,}/)[0]])).toEqual([
        ["h-dead", "ready, silent"],
        ["h-live", "ready"],
        ["h-old", "ready"],
      ])
    } finally {
      await page.close()
    }
    const one = await answering(200, host("h-dead", true))
    try {
      const r = await engram(["hosts", "show", "h-dead"], { env: { ENGRAM_TOKEN: adminToken, ENGRAM_URL: one.url } })
      expect(r.stdout).toMatch(/^state\s+ready \(silent: its agent has not reported within the stale window; takes nothing until it does\)$/m)
    } finally {
      await one.close()
    }
  })

  it("status counts the silent hosts and their part of the free RAM", async () => {
    const fleet = {
      hosts: { total: 2, ready: 2, measured: 2, cordoned: 0, draining: 0, silent: 1, readySilent: 1 },
      capacityMib: 16384,
      reservedMib: 0,
      freeMib: 16384,
      cpuBudget: 32,
      reservedVcpus: 0,
      freeVcpus: 32,
      silentFreeMib: 8192,
      silentFreeVcpus: 16,
      queue: { sessions: 0, memMib: 0, vcpus: 0, withoutRoom: 0 },
      unplaceable: { count: 0, largestMemMib: 0, largestVcpus: 0 },
      parks: 0,
      descentsRunning: 0,
      readAt: Date.now(),
    }
    const server = await answering(200, fleet)
    try {
      const r = await engram(["status"], { env: { ENGRAM_TOKEN: adminToken, ENGRAM_URL: server.url } })
      expect(r.code, r.stderr).toBe(0)
      expect(r.stdout).toMatch(
        /^hosts\s+2 \(2 ready, 0 cordoned, 0 draining; 2 measured\); 1 silent \(no report within the stale window: take nothing until their agents report; 8 GiB of the free RAM is theirs\)$/m,
      )
    } finally {
      await server.close()
    }
  })
})
