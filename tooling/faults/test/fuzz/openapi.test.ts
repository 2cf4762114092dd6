// The OpenAPI-driven fuzzer: requests built from the API's own document (every operation; valid
// and hostile bodies, path ids and queries; the admin's, a host's, no and a wrong credential) sent
// over real HTTP to a real coordinator, on the embedded PGlite store and on PostgreSQL. Each must
// be answered within a bound, never with a 5xx (but a move's own 503 outcomes, which carry their
// request id), every 4xx is a JSON body with an `error` code (a 400 names the field and the rule),
// a request with a key its operation does not declare (in the body or the query), or with a
// percent-escape that is not UTF-8, is never accepted, and a 4xx changes nothing (the sessions, hosts, reservations and moves read the same
// before and after).
import { EngramApi } from "@engram/api"
import type { RunningCoordinator } from "@engram/coordinator"
import { OpenApi } from "effect/http-api"
import fc from "fast-check"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { OpenApiArbitraries } from "../../src/index.js"
import { backends, settled, unjudged } from "./backends.js"

const ADMIN = "fuzz-admin-token-0123456789abcdef"
/** Requests per operation and backend (ENGRAM_FUZZ_RUNS raises it for a longer hunt). */
const RUNS = Number(process.env["ENGRAM_FUZZ_RUNS"] ?? 8)
/**
 * Generous: a long-poll given its timeout waits at most 1.5 s here, one without it the default
 * 30 s (answered at its deadline, so the bound must be above it), a move at most its 1 s timeout.
 */
const BOUND_MS = 45_000
/** The 503s a move may answer by contract (SPEC §5: the guard, an abort, no agent in time). */
const MOVE_OUTCOMES = new Set(["ErrMoveDowntime", "MoveAborted", "MoveTimeout", "MoveCommitPending"])

const doc = OpenApi.fromApi(EngramApi) as unknown as Parameters<typeof OpenApiArbitraries.operations>[0]
const ops = OpenApiArbitraries.operations(doc)

interface Answer {
  readonly status: number
  readonly text: string
  readonly json: unknown
  readonly requestId: string | null
}

const send = async (url: string, tokens: { admin: string; host: string }, req: OpenApiArbitraries.FuzzRequest): Promise<Answer> => {
  const headers: Record<string, string> = {}
  if (req.auth === "admin") headers["authorization"] = `Bearer ${tokens.admin}`
  if (req.auth === "host") headers["authorization"] = `Bearer ${tokens.host}`
  if (req.auth === "garbage") headers["authorization"] = "Bearer \u00ff\u00fe not a token"
  let body: string | undefined
  if (req.body !== null) {
    headers["content-type"] = "application/json"
    body = "json" in req.body ? JSON.stringify(req.body.json) : req.body.raw
  }
  const res = await fetch(`${url}${req.path}`, { method: req.method, headers, ...(body === undefined ? {} : { body }), signal: AbortSignal.timeout(BOUND_MS) })
  const text = await res.text()
  let json: unknown = undefined
  try {
    json = JSON.parse(text)
  } catch {
    // not JSON: judged below where JSON is required
  }
  return { status: res.status, text, json, requestId: res.headers.get("x-request-id") }
}

/** What a 4xx must leave as it was (`unjudged`: what is judged at the read's time left out). */
const snapshot = async (url: string): Promise<string> => {
  const read = async (path: string) => {
    const res = await fetch(`${url}${path}?limit=1000`, { headers: { authorization: `Bearer ${ADMIN}` }, signal: AbortSignal.timeout(BOUND_MS) })
    expect(res.status, `snapshot ${path}`).toBe(200)
    return unjudged(path, await res.json())
  }
  return JSON.stringify(await Promise.all(["/v1/sessions", "/v1/hosts", "/v1/reservations", "/v1/moves", "/v1/queue"].map(read)))
}

const describeRequest = (req: OpenApiArbitraries.FuzzRequest) => {
  const b = req.body === null ? "" : "json" in req.body ? JSON.stringify(req.body.json) : req.body.raw
  const path = req.path.length > 300 ? `${req.path.slice(0, 300)}… (${req.path.length} chars)` : req.path
  return `${req.method} ${path} (${req.auth}) ${b.length > 300 ? `${b.slice(0, 300)}… (${b.length} chars)` : b}`
}

for (const backend of backends) {
  describe(`the OpenAPI fuzzer on ${backend.name}`, () => {
    let c: RunningCoordinator
    let done: () => Promise<void>
    let hostToken = ""
    const ids = ["fz-h1", "fz-h2", "fz-h3", "fz-s1", "fz-s2", "fz-s3", "fz-r1", "fz-missing"]

    beforeAll(async () => {
      ;({ c, done } = await backend.start(ADMIN))
      const admin = (method: string, path: string, body?: unknown) =>
        fetch(`${c.url}${path}`, { method, headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" }, ...(body === undefined ? {} : { body: JSON.stringify(body) }) }).then(async (r) => ({
          status: r.status,
          body: (await r.json()) as Record<string, unknown>,
        }))
      // Something for valid ids to name: reported hosts, one not reported, sessions placed and queued, an external reservation.
      for (const id of ["fz-h1", "fz-h2", "fz-h3"]) {
        const created = await admin("POST", "/v1/hosts", { id })
        expect(created.status).toBe(201)
        if (id === "fz-h1") hostToken = created.body["token"] as string
        if (id !== "fz-h3") expect((await admin("PUT", `/v1/hosts/${id}/report`, { totalMib: 8192, allocatableMib: 8192, totalVcpus: 8 })).status).toBe(200)
      }
      expect((await admin("POST", "/v1/sessions", { id: "fz-s1", memMib: 1024, vcpus: 1, affinity: ["fz-h1"] })).status).toBe(201)
      expect((await admin("POST", "/v1/sessions", { id: "fz-s2", memMib: 512, vcpus: 1 })).status).toBe(201)
      expect((await admin("POST", "/v1/sessions", { id: "fz-s3", memMib: 100_000, vcpus: 1 })).status).toBe(202)
      expect((await admin("POST", "/v1/reservations", { id: "fz-r1", hostId: "fz-h2", ownerKind: "external", ownerId: "fz", memMib: 256, vcpus: 1 })).status).toBe(201)
    })
    afterAll(async () => {
      await c?.stop()
      await done?.()
    })

    // 179 s of it on PGlite in a CI run beside another (load 20): a bound far above that.
    it("every operation: answered in bound, never a 5xx, every 4xx a JSON error naming the field and rule, a 4xx changes nothing", { timeout: Math.max(900_000, RUNS * 40_000) }, async () => {
      const tokens = { admin: ADMIN, host: hostToken }
      let before: string | null = null
      const seen = new Map<string, Map<number, number>>()
      for (const op of ops) {
        await fc.assert(
          fc.asyncProperty(OpenApiArbitraries.request(op, ids), async (req) => {
            before ??= await settled(() => snapshot(c.url))
            const answer = await send(c.url, tokens, req)
            const what = `${describeRequest(req)} → ${answer.status} ${answer.text.slice(0, 300)}`
            const counts = seen.get(req.operation) ?? new Map<number, number>()
            counts.set(answer.status, (counts.get(answer.status) ?? 0) + 1)
            seen.set(req.operation, counts)
            if (answer.status >= 500) {
              const { error, requestId } = (answer.json ?? {}) as { error?: unknown; requestId?: unknown }
              expect(req.operation === "POST /v1/sessions/{id}/move" && answer.status === 503 && MOVE_OUTCOMES.has(String(error)), `a 5xx: ${what}`).toBe(true)
              expect(typeof requestId === "string" && requestId === answer.requestId, `a 5xx without its request id in the body and the x-request-id header: ${what}`).toBe(true)
            }
            if (req.badEscape) expect(answer.status, `a URL with an escape that is not UTF-8 was accepted: ${what}`).toBeGreaterThanOrEqual(400)
            if (req.undeclared !== null) expect(answer.status, `a request with the undeclared key ${JSON.stringify(req.undeclared)} was accepted: ${what}`).toBeGreaterThanOrEqual(400)
            if (answer.status >= 400 && answer.status < 500) {
              expect(typeof answer.json === "object" && answer.json !== null && typeof (answer.json as { error?: unknown }).error === "string", `a 4xx without a JSON error: ${what}`).toBe(true)
              if (answer.status === 400) {
                const { field, rule } = answer.json as { field?: unknown; rule?: unknown }
                expect(typeof field === "string" && field !== "" && typeof rule === "string" && rule !== "", `a 400 that names no field or rule: ${what}`).toBe(true)
              }
              const after = await snapshot(c.url)
              expect(after, `a 4xx changed something: ${what}`).toBe(before)
              before = after
            } else {
              // A 2xx (or a move's 503: a move begun, then aborted) may change things: read afresh
              // once settled before the next request.
              before = null
            }
          }),
          {
            numRuns: RUNS,
            endOnFailure: true,
            // The counterexample may hold a 900 KB string: say it shortened, with the seed to replay it.
            reporter: (run) => {
              if (!run.failed) return
              const [req] = run.counterexample ?? []
              throw new Error(
                `${req === undefined ? op.path : describeRequest(req)}\nseed ${run.seed}, path ${run.counterexamplePath ?? ""}\n${run.errorInstance instanceof Error ? run.errorInstance.message.slice(0, 2000) : String(run.errorInstance)}`,
              )
            },
          },
        )
      }
      // Every operation was exercised; a quarter of them answered a 2xx at least once (the valid
      // arbitraries reach the handlers; one seed gave 12 of 43 with 8 requests per operation).
      expect([...seen.keys()].length).toBe(ops.length)
      const anyOk = [...seen.values()].filter((counts) => [...counts.keys()].some((s) => s < 300)).length
      expect(anyOk).toBeGreaterThanOrEqual(Math.floor(ops.length / 4))
    })
  })
}
