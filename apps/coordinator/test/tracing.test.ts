// OpenTelemetry traces over OTLP/HTTP to a collector this test runs (a node:http server that
// keeps every export): a placement and a move, each one trace, with the spans' names and
// parent links as a team's Jaeger or Tempo would show them.
import { startCoordinator } from "@engram/coordinator"
import type { RunningCoordinator } from "@engram/coordinator"
import { StoreSim } from "@engram/store-sim"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { client, pendingMove, uid } from "./support/http.js"

const adminToken = "tracing-admin-token-0123456789"

interface OtlpValue {
  readonly stringValue?: string
  readonly intValue?: string | number
  readonly doubleValue?: number
  readonly boolValue?: boolean
}
interface OtlpSpan {
  readonly traceId: string
  readonly spanId: string
  readonly parentSpanId?: string
  readonly name: string
  readonly kind: number
  readonly attributes: readonly { readonly key: string; readonly value: OtlpValue }[]
  readonly links?: readonly { readonly traceId: string; readonly spanId: string }[]
}
interface Export {
  readonly resourceSpans: readonly {
    readonly resource: { readonly attributes: readonly { readonly key: string; readonly value: OtlpValue }[] }
    readonly scopeSpans: readonly { readonly spans: readonly OtlpSpan[] }[]
  }[]
}

/** The collector: every export it received, raw and decoded, and the headers it came with. */
const received: { readonly raw: string; readonly body: Export; readonly headers: Record<string, string | string[] | undefined> }[] = []
const collector = createServer((req, res) => {
  let raw = ""
  req.on("data", (c: Buffer) => (raw += c.toString()))
  req.on("end", () => {
    if (req.method === "POST" && req.url === "/v1/traces" && (req.headers["content-type"] ?? "").includes("json")) {
      received.push({ raw, body: JSON.parse(raw) as Export, headers: req.headers })
      res.writeHead(200, { "content-type": "application/json" }).end("{}")
    } else res.writeHead(404).end()
  })
})

let c: RunningCoordinator
const spans = () => received.flatMap((r) => r.body.resourceSpans.flatMap((rs) => rs.scopeSpans.flatMap((ss) => ss.spans)))
const attr = (s: OtlpSpan, key: string): unknown => {
  const v = s.attributes.find((a) => a.key === key)?.value
  return v === undefined ? undefined : (v.stringValue ?? (v.intValue === undefined ? undefined : Number(v.intValue)) ?? v.doubleValue ?? v.boolValue)
}
const named = (name: string, where: (s: OtlpSpan) => boolean = () => true) => spans().filter((s) => s.name === name && where(s))
const one = (name: string, where: (s: OtlpSpan) => boolean = () => true) => {
  const found = named(name, where)
  expect(found.map((s) => s.name), `one ${name} span among ${spans().map((s) => s.name).join(", ")}`).toEqual([name])
  return found[0] as OtlpSpan
}
const byId = (id: string | undefined) => spans().find((s) => s.spanId === id)

const session = uid("traced")
const [source, target] = [uid("src"), uid("dst")]

beforeAll(async () => {
  await new Promise<void>((r) => collector.listen(0, "127.0.0.1", r))
  const otlpUrl = `http://127.0.0.1:${(collector.address() as AddressInfo).port}`
  c = await startCoordinator({
    store: StoreSim.layer(),
    reaper: false,
    logLevel: "Error",
    config: { port: 0, adminToken, otlpUrl, otlpHeaders: "x-collector-key=k%3D1" },
    otlpExportIntervalMs: 200,
  })
  const api = client(c.url, adminToken)
  for (const id of [source, target]) {
    expect((await api.post("/v1/hosts", { id })).status).toBe(201)
    expect((await api.put(`/v1/hosts/${id}/report`, { totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 })).status).toBe(200)
  }
  // A placement, then a move of the placed session, the source agent's part by hand.
  expect((await api.post("/v1/sessions", { id: session, memMib: 1024, vcpus: 1, affinity: [source] })).status).toBe(201)
  expect((await api.post(`/v1/sessions/${session}/started`)).status).toBe(200)
  const moved = api.post(`/v1/sessions/${session}/move`, { targetHostId: target, maxDowntimeMs: 700 })
  const moveId = await pendingMove(api, source, session)
  expect((await api.post(`/v1/moves/${moveId}/rounds`, { kind: "full", wireBytes: 64 << 20, apparentBytes: 512 << 20, sendMs: 300, captureMs: 40 })).status).toBe(200)
  expect((await api.post(`/v1/moves/${moveId}/rounds`, { kind: "final", wireBytes: 4 << 20, apparentBytes: 8 << 20, sendMs: 80, captureMs: 40 })).status).toBe(200)
  expect((await api.post(`/v1/moves/${moveId}/commit`, { downtimeMs: 560, captureMs: 40, sendMs: 80, commitMs: 390 })).status).toBe(200)
  expect((await moved).status).toBe(200)
  // Probes and scrapes: no spans.
  expect((await fetch(`${c.url}/livez`)).status).toBe(200)
  expect((await api.get("/metrics")).status).toBe(200)
  // Stopping sends what is left; every span above has ended by then.
  await c.stop()
})
afterAll(async () => {
  await c?.stop()
  await new Promise<void>((r) => collector.close(() => r()))
})

describe("traces over OTLP (ENGRAM_OTLP_URL)", () => {
  it("go to <url>/v1/traces as OTLP JSON, from the service engram-coordinator, with the configured headers", () => {
    expect(received.length).toBeGreaterThan(0)
    const resource = received[0]!.body.resourceSpans[0]!.resource.attributes
    expect(resource.find((a) => a.key === "service.name")?.value.stringValue).toBe("engram-coordinator")
    expect(received[0]!.headers["x-collector-key"]).toBe("k=1")
    // No credential travels in a span.
    for (const r of received) expect(r.raw).not.toContain(adminToken)
  })

  it("probes, scrapes and the background loops (reaper, reconcile, the dashboard's samples) make no spans", () => {
    expect(spans().filter((s) => /^GET \/(livez|metrics)/.test(s.name))).toEqual([])
    // Every store call belongs to a request's trace.
    expect(spans().filter((s) => s.name.startsWith("engram.store.") && (s.parentSpanId ?? "") === "").map((s) => s.name)).toEqual([])
  })

  it("a placement is one trace: the request's server span, engram.session.create, and the store's createSession under it", () => {
    const create = one("engram.session.create", (s) => attr(s, "engram.session.id") === session)
    expect([attr(create, "engram.outcome"), attr(create, "engram.host.id"), attr(create, "engram.budget.mem_mib")]).toEqual(["placed", source, 1024])
    const request = byId(create.parentSpanId)
    expect(request?.name).toBe("POST /v1/sessions")
    expect(request?.kind).toBe(2) // SERVER
    expect(request?.parentSpanId ?? "").toBe("")
    const store = one("engram.store.createSession", (s) => s.parentSpanId === create.spanId)
    for (const s of [request!, store]) expect(s.traceId).toBe(create.traceId)
  })

  it("a move is one trace: engram.session.move holds beginMove, the wait, and each round and the commit the agent reported in its own requests", () => {
    const move = one("engram.session.move", (s) => attr(s, "engram.session.id") === session)
    expect([attr(move, "engram.host.source"), attr(move, "engram.host.target"), attr(move, "engram.move.outcome"), attr(move, "engram.move.max_downtime_ms")]).toEqual([
      source,
      target,
      "Committed",
      700,
    ])
    expect(byId(move.parentSpanId)?.name).toBe("POST /v1/sessions/:id/move")
    const moveId = attr(move, "engram.move.id")
    const children = spans().filter((s) => s.parentSpanId === move.spanId)
    // The named target's host read is the check that it advertises a peer URL (a warning if not).
    expect(children.map((s) => s.name).sort()).toEqual(["engram.move.commit", "engram.move.round", "engram.move.round", "engram.move.wait", "engram.store.beginMove", "engram.store.getHost"])
    for (const s of children) expect(s.traceId).toBe(move.traceId)
    expect(children.filter((s) => s.name === "engram.move.round").map((s) => attr(s, "engram.round.kind"))).toEqual(["full", "final"])
    const commit = children.find((s) => s.name === "engram.move.commit")!
    expect([attr(commit, "engram.move.id"), attr(commit, "engram.move.downtime_ms")]).toEqual([moveId, 560])
    expect(attr(children.find((s) => s.name === "engram.move.wait")!, "engram.move.downtime_ms")).toBe(560)
    // Each step links to the request that carried it, a trace of its own.
    for (const step of children.filter((s) => s.name === "engram.move.round" || s.name === "engram.move.commit")) {
      const link = step.links?.[0]
      const carrier = byId(link?.spanId)
      expect(carrier?.name).toBe(step.name === "engram.move.round" ? "POST /v1/moves/:id/rounds" : "POST /v1/moves/:id/commit")
      expect(carrier?.traceId).not.toBe(move.traceId)
      // The store's write of the step is in the step's span.
      expect(spans().some((s) => s.parentSpanId === step.spanId && s.name === (step.name === "engram.move.round" ? "engram.store.recordRound" : "engram.store.commitMove"))).toBe(true)
    }
  })
})
