/**
 * The fleet bench's load: a process of its own (its CPU is not the coordinator's), raw
 * keep-alive sockets (`raw-http.ts`: no `http.Agent` or stream per request, so 10,000 agents
 * cost the generator little), driven by JSON
 * commands on stdin, answering one JSON line each on stdout:
 *
 * - `agents`: N host agents as the real one behaves with its defaults: a long-poll of its
 *   assignments (`waitMs` 20 s, `since` its last version) on a connection of its own, a
 *   heartbeat every 40 s and a report every 30 s (each agent's phase random), those two over a
 *   shared keep-alive pool (as a proxy in front of a coordinator would hold them);
 * - `probe`: ordinary requests (a session's record, a host's record) at a fixed concurrency: p50, p99;
 * - `creates`: session creates at a fixed concurrency for a duration: rate, p50, p99, failures;
 * - `waits`: long-polls opened at once (session waits and assignments polls), each answer's
 *   time against its bound;
 * - `stats` (the agents' counters since the last `reset`), `reset`, `stop`.
 */
import { monitorEventLoopDelay } from "node:perf_hooks"
import { createInterface } from "node:readline"
import { Pool } from "./raw-http.js"

const pct = (sorted: readonly number[], p: number): number => sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))] ?? 0
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))
const summary = (latencies: number[]) => {
  latencies.sort((a, b) => a - b)
  return { count: latencies.length, p50: pct(latencies, 50), p99: pct(latencies, 99), max: latencies[latencies.length - 1] ?? 0 }
}

// ---- agents ---------------------------------------------------------------------------------

interface AgentSpec {
  readonly id: string
  readonly token: string
}

interface AgentsCommand {
  readonly cmd: "agents"
  readonly url: string
  readonly agents: readonly AgentSpec[]
  readonly pollWaitMs: number
  readonly heartbeatMs: number
  readonly reportMs: number
  readonly sharedSockets: number
}

const counters = () => ({ polls: 0, pollErrors: 0, heartbeats: 0, heartbeatErrors: 0, reports: 0, reportErrors: 0, pollsOpen: 0, latePolls: 0, maxPollOverMs: 0 })
let stats = counters()
/** What the failed polls answered (status, or 0 for a connection error), since the last `reset`. */
let pollErrorStatuses = new Map<number, number>()
/** The first few connection errors of polls, as text. */
let pollErrorSample: string[] = []
const pollFailed = (status: number, error?: unknown) => {
  stats.pollErrors++
  if (error !== undefined && pollErrorSample.length < 5) pollErrorSample.push(String(error))
  pollErrorStatuses.set(status, (pollErrorStatuses.get(status) ?? 0) + 1)
}
/** Each heartbeat from its bytes written to its answer (what the coordinator took, and this process's turn to read it). */
let heartbeatLatencies: number[] = []
/** Each heartbeat's lag in this process before its bytes were written: its timer firing late plus its wait in the shared pool's queue. */
let heartbeatSendLags: number[] = []
/** Each heartbeat from its due time to its answer (send lag + answer), what an agent of its own would not see (its lag is this process's). */
let heartbeatTotals: number[] = []
/** This process's event-loop delay (a starved generator writes its requests late). */
/** Every heartbeat since the agents started (not reset): [seconds since the start it was due, written → answered ms, lag before writing ms]. */
const heartbeatTimeline: [number, number, number][] = []
/** Heartbeats written on a connection opened for them, and their worst answer (ms), since the agents started. */
const freshHeartbeats = { count: 0, maxAnswerMs: 0, over1s: 0 }
/** Heartbeats written on a connection already open, and their worst answer (ms), since the agents started. */
const reusedHeartbeats = { count: 0, maxAnswerMs: 0, over1s: 0 }
let agentsStarted = 0
const loopDelay = monitorEventLoopDelay({ resolution: 10 })
loopDelay.enable()
let running = true

const runAgents = (c: AgentsCommand): void => {
  agentsStarted = performance.now()
  const url = new URL(c.url)
  const target = { host: url.hostname, port: Number(url.port) }
  const shared = new Pool(target, c.sharedSockets)
  const report = JSON.stringify({ totalMib: 262_144, allocatableMib: 262_144, totalVcpus: 64 })
  c.agents.forEach((a, i) => {
    const own = new Pool(target, 1)
    let since: string | undefined
    const poll = async (): Promise<void> => {
      // Spread the first polls over two seconds, as agents starting at different times would.
      await sleep((i / c.agents.length) * 2000)
      while (running) {
        const t0 = performance.now()
        stats.pollsOpen++
        try {
          const r = await own.request("GET", `/v1/hosts/${a.id}/assignments?waitMs=${c.pollWaitMs}${since === undefined ? "" : `&since=${encodeURIComponent(since)}`}`, a.token)
          stats.pollsOpen--
          if (r.status !== 200) {
            pollFailed(r.status)
            await sleep(1000 + Math.random() * 1000)
            continue
          }
          const version = (JSON.parse(r.body) as { version: string }).version
          const tookMs = performance.now() - t0
          if (since !== undefined && version === since && tookMs > c.pollWaitMs + 1000) {
            stats.latePolls++
            stats.maxPollOverMs = Math.max(stats.maxPollOverMs, tookMs - c.pollWaitMs)
          }
          since = version
          stats.polls++
        } catch (e) {
          stats.pollsOpen--
          pollFailed(0, e)
          await sleep(1000 + Math.random() * 1000)
        }
      }
    }
    // `call` is given how late (ms) its timer fired.
    const every = (periodMs: number, call: (lateMs: number) => Promise<void>) => {
      const after = (ms: number) => {
        const due = performance.now() + ms
        setTimeout(() => void tick(due), ms)
      }
      const tick = async (due: number): Promise<void> => {
        if (!running) return
        await call(performance.now() - due)
        after(periodMs)
      }
      after(Math.random() * periodMs)
    }
    void poll()
    every(c.heartbeatMs, async (lateMs) => {
      try {
        const r = await shared.request("POST", `/v1/hosts/${a.id}/heartbeat`, a.token, "{}")
        if (r.status === 200) stats.heartbeats++
        else stats.heartbeatErrors++
        heartbeatLatencies.push(r.answerMs)
        heartbeatSendLags.push(lateMs + r.queuedMs)
        heartbeatTotals.push(lateMs + r.queuedMs + r.answerMs)
        const kind = r.fresh ? freshHeartbeats : reusedHeartbeats
        kind.count++
        kind.maxAnswerMs = Math.max(kind.maxAnswerMs, r.answerMs)
        if (r.answerMs > 1000) kind.over1s++
        heartbeatTimeline.push([(performance.now() - r.answerMs - r.queuedMs - lateMs - agentsStarted) / 1000, r.answerMs, lateMs + r.queuedMs])
      } catch {
        stats.heartbeatErrors++
      }
    })
    every(c.reportMs, async () => {
      try {
        const r = await shared.request("PUT", `/v1/hosts/${a.id}/report`, a.token, report)
        if (r.status === 200) stats.reports++
        else stats.reportErrors++
      } catch {
        stats.reportErrors++
      }
    })
  })
}

// ---- ordinary requests, creates, waits --------------------------------------------------------

interface ProbeCommand {
  readonly cmd: "probe"
  readonly url: string
  readonly token: string
  readonly paths: readonly string[]
  readonly concurrency: number
  readonly durationMs: number
}

const probe = async (c: ProbeCommand) => {
  const url = new URL(c.url)
  const target = { host: url.hostname, port: Number(url.port) }
  const agent = new Pool(target, c.concurrency)
  const latencies: number[] = []
  let failures = 0
  let n = 0
  const until = performance.now() + c.durationMs
  await Promise.all(
    Array.from({ length: c.concurrency }, async () => {
      while (performance.now() < until) {
        const path = c.paths[n++ % c.paths.length] as string
        const t0 = performance.now()
        const r = await agent.request("GET", path, c.token).catch(() => ({ status: 0, body: "" }))
        latencies.push(performance.now() - t0)
        if (r.status !== 200) failures++
      }
    }),
  )
  agent.destroy()
  return { ...summary(latencies), failures }
}

interface CreatesCommand {
  readonly cmd: "creates"
  readonly url: string
  readonly token: string
  readonly prefix: string
  readonly concurrency: number
  readonly durationMs: number
}

const creates = async (c: CreatesCommand) => {
  const url = new URL(c.url)
  const target = { host: url.hostname, port: Number(url.port) }
  const agent = new Pool(target, c.concurrency)
  const latencies: number[] = []
  let failures = 0
  let firstFailure = ""
  let n = 0
  const started = performance.now()
  const until = started + c.durationMs
  await Promise.all(
    Array.from({ length: c.concurrency }, async () => {
      while (performance.now() < until) {
        const i = n++
        const t0 = performance.now()
        const body = JSON.stringify({ id: `${c.prefix}-${i}`, memMib: 128 * (1 + (i % 8)), vcpus: 1 })
        const r = await agent.request("POST", "/v1/sessions", c.token, body).catch((e: unknown) => ({ status: 0, body: String(e) }))
        latencies.push(performance.now() - t0)
        if (r.status !== 201) {
          failures++
          if (firstFailure === "") firstFailure = `${r.status} ${r.body.slice(0, 200)}`
        }
      }
    }),
  )
  agent.destroy()
  return { ...summary(latencies), perSec: latencies.length / ((performance.now() - started) / 1000), failures, firstFailure }
}

interface WaitsCommand {
  readonly cmd: "waits"
  readonly url: string
  readonly token: string
  /** Session ids to wait on (`state=running`; they stay pending). */
  readonly sessions: readonly string[]
  /** Hosts whose assignments to long-poll, with their agents' tokens and current versions. */
  readonly hosts: readonly { readonly id: string; readonly token: string; readonly version: string }[]
  readonly timeoutMs: number
}

const waits = async (c: WaitsCommand) => {
  const url = new URL(c.url)
  const target = { host: url.hostname, port: Number(url.port) }
  const agent = new Pool(target, c.sessions.length + c.hosts.length)
  const over: number[] = []
  const statuses = new Map<number, number>()
  const one = async (path: string, token: string) => {
    const t0 = performance.now()
    const r = await agent.request("GET", path, token).catch(() => ({ status: 0, body: "" }))
    over.push(performance.now() - t0 - c.timeoutMs)
    statuses.set(r.status, (statuses.get(r.status) ?? 0) + 1)
  }
  await Promise.all([
    ...c.sessions.map((id) => one(`/v1/sessions/${id}/wait?state=running&timeoutMs=${c.timeoutMs}`, c.token)),
    ...c.hosts.map((h) => one(`/v1/hosts/${h.id}/assignments?waitMs=${c.timeoutMs}&since=${encodeURIComponent(h.version)}`, h.token)),
  ])
  agent.destroy()
  over.sort((a, b) => a - b)
  return { waits: over.length, statuses: Object.fromEntries(statuses), maxOverMs: over[over.length - 1] ?? 0, p50OverMs: pct(over, 50), withinBound: over.filter((x) => x <= 1000).length }
}

// ---- commands -----------------------------------------------------------------------------

type Command = (AgentsCommand | ProbeCommand | CreatesCommand | WaitsCommand | { readonly cmd: "stats" | "reset" | "stop" }) & { readonly id: number }

for await (const line of createInterface({ input: process.stdin })) {
  if (line.trim() === "") continue
  const c = JSON.parse(line) as Command
  // Each answer names its command: a `waits` answers when its waits have, after later commands.
  const answer = (value: unknown) => process.stdout.write(`${JSON.stringify({ id: c.id, value })}\n`)
  switch (c.cmd) {
    case "agents":
      runAgents(c)
      answer({ ok: true })
      break
    case "probe":
      answer(await probe(c))
      break
    case "creates":
      answer(await creates(c))
      break
    case "waits":
      // Answered when every wait has; other commands may run meanwhile.
      void waits(c).then(answer)
      break
    case "stats":
      answer({
        ...stats,
        pollErrorStatuses: Object.fromEntries(pollErrorStatuses),
        pollErrorSample,
        heartbeatLatency: summary([...heartbeatLatencies]),
        heartbeatSendLag: summary([...heartbeatSendLags]),
        heartbeatTotal: summary([...heartbeatTotals]),
        // Heartbeats since the agents started, by 5 s of their due time: the worst answer and lag of each.
        freshHeartbeats,
        reusedHeartbeats,
        heartbeatTimeline: Object.entries(
          heartbeatTimeline.reduce<Record<number, { n: number; answerMax: number; lagMax: number }>>((acc, [t, answer, lag]) => {
            const b = (acc[Math.floor(t / 5) * 5] ??= { n: 0, answerMax: 0, lagMax: 0 })
            b.n++
            b.answerMax = Math.max(b.answerMax, Math.round(answer))
            b.lagMax = Math.max(b.lagMax, Math.round(lag))
            return acc
          }, {}),
        ).map(([t, b]) => `${t}s:${b.n}/${b.answerMax}/${b.lagMax}`).join(" "),
        loopDelay: { p50: loopDelay.percentile(50) / 1e6, p99: loopDelay.percentile(99) / 1e6, max: loopDelay.max / 1e6 },
      })
      break
    case "reset":
      stats = { ...counters(), pollsOpen: stats.pollsOpen }
      heartbeatLatencies = []
      heartbeatSendLags = []
      heartbeatTotals = []
      loopDelay.reset()
      pollErrorStatuses = new Map()
      pollErrorSample = []
      answer({ ok: true })
      break
    case "stop":
      running = false
      answer({ ok: true })
      process.exit(0)
  }
}
