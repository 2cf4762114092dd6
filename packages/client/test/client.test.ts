// The client against a real coordinator over real HTTP: every call answers the records the
// coordinator sent, errors arrive as the classes a caller tells apart (Promise and Effect),
// lists are pages followed by their cursors, and every call is one of the API's endpoints.
import type { RunningCoordinator } from "@engram/coordinator"
import { EngramApi } from "@engram/api"
import { Effect } from "effect"
import { HttpClient, HttpClientResponse } from "effect/http"
import { HttpApi } from "effect/http-api"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Conflict, createClient, EngramClient, Errors, InvalidInput, make, MoveDowntime, NotFound, Page, TooManyRequests, TransportError, Unauthorized, UnexpectedAnswer, WaitTimeout } from "../src/index.js"
import type { Engram, EngramClientShape } from "../src/index.js"
import { addHost, adminToken, call, pendingMove, start, started, uid } from "./support/Fleet.js"

let c: RunningCoordinator
let engram: Engram
const big = uid("big")
const small = uid("small")

beforeAll(async () => {
  c = await start()
  engram = createClient({ baseUrl: c.url, token: adminToken })
  await addHost(c.url, big, 8192, 8)
  await addHost(c.url, small, 4096, 4)
})
afterAll(() => c?.stop())

describe("the Promise client", () => {
  it("creates a session that places on the best-fitting host and reads it back", async () => {
    const id = uid("s")
    const placed = await engram.sessions.create({ id, memMib: 1024, vcpus: 1 })
    expect(placed).toMatchObject({ outcome: "placed", id, state: "pending", hostId: small })
    const s = await engram.sessions.get(id)
    expect(s).toMatchObject({ id, state: "pending", hostId: small, budget: { memMib: 1024, vcpus: 1 } })
    await engram.sessions.end(id)
  })

  it("creates a session with an idle timeout and a TTL, and sets a new TTL", async () => {
    const id = uid("s")
    await engram.sessions.create({ id, memMib: 512, vcpus: 1, idleTimeoutMs: 300_000, ttlMs: 7_200_000 })
    const s = await engram.sessions.get(id)
    expect(s).toMatchObject({ idleTimeoutMs: 300_000 })
    const set = await engram.sessions.setTtl(id, 60_000)
    expect(set.endsAt).not.toBeNull()
    expect(set.endsAt as number).toBeLessThan(s.endsAt as number)
    await engram.sessions.end(id)
  })

  it("a session that fits nowhere is queued with each host's reason", async () => {
    const id = uid("huge")
    const queued = await engram.sessions.create({ id, memMib: 64 * 1024, vcpus: 1 })
    expect(queued.outcome).toBe("queued")
    if (queued.outcome !== "queued") return
    expect(queued.position).toBeGreaterThanOrEqual(1)
    expect(queued.noFit.map((d) => [d.hostId, d.reason]).sort()).toEqual([
      [big, "ram_full"],
      [small, "ram_full"],
    ].sort())
    await engram.sessions.end(id)
  })

  it("idles a running session into a park and ends it", async () => {
    const id = uid("s")
    await engram.sessions.create({ id, memMib: 512, vcpus: 1, affinity: [big] })
    await started(c.url, id)
    expect(await engram.sessions.idle(id)).toEqual({ id, state: "parked" })
    const ended = await engram.sessions.end(id)
    expect(ended).toMatchObject({ id, state: "ended", hostId: null })
  })

  it("an unknown session is a NotFound naming the entity and id", async () => {
    const err = await engram.sessions.get("no-such-session").catch((e: unknown) => e)
    expect(err).toBeInstanceOf(NotFound)
    expect(err).toMatchObject({ entity: "session", id: "no-such-session", status: 404 })
  })

  it("bad input is an InvalidInput naming the field and the rule, and creates nothing", async () => {
    const err = await engram.sessions.create({ id: "bad id!", memMib: 512, vcpus: 1 }).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(InvalidInput)
    const e = err as InvalidInput
    expect(e.field).toBe("id")
    expect(e.rule).toBe("must be 1-100 characters of [A-Za-z0-9._-], and not . or ..")
    // Refused before it was sent: no answer, no status.
    expect(e.status).toBeNull()
    expect(Errors.describe(e)).toBe(`invalid input: id ${e.rule}`)
    expect((await call(c.url, "GET", "/v1/sessions?state=pending")).body).not.toContainEqual(expect.objectContaining({ id: "bad id!" }))
  })

  it("an illegal transition is a Conflict naming both states", async () => {
    const id = uid("s")
    await engram.sessions.create({ id, memMib: 256, vcpus: 1 })
    const err = await engram.sessions.idle(id).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(Conflict)
    expect(err).toMatchObject({ code: "IllegalTransition", from: "pending", status: 409 })
    await engram.sessions.end(id)
  })

  it("a wrong token is Unauthorized, an unreachable coordinator a TransportError", async () => {
    const wrong = createClient({ baseUrl: c.url, token: "not-the-token-0123456789" })
    await expect(wrong.fleet.snapshot()).rejects.toBeInstanceOf(Unauthorized)
    const nowhere = createClient({ baseUrl: "http://127.0.0.1:1", token: adminToken })
    const err = await nowhere.fleet.snapshot().catch((e: unknown) => e)
    expect(err).toBeInstanceOf(TransportError)
    expect((err as TransportError).message).toContain("http://127.0.0.1:1")
  })

  it("a move refused by the downtime guard is a MoveDowntime with the estimate", async () => {
    const id = uid("m")
    await engram.sessions.create({ id, memMib: 512, vcpus: 1, affinity: [small] })
    await started(c.url, id)
    const moving = engram.sessions.move(id, { targetHostId: big, maxDowntimeMs: 300 }).catch((e: unknown) => e)
    // The source agent's part, by hand: its guard estimated 812 ms and refused before pausing.
    const move = await pendingMove(c.url, small, id)
    expect((await call(c.url, "POST", `/v1/moves/${move.id}/abort`, { reason: "estimate over budget", estimateMs: 812 })).status).toBe(200)
    const err = await moving
    expect(err).toBeInstanceOf(MoveDowntime)
    expect(err).toMatchObject({ moveId: move.id, estimateMs: 812, maxDowntimeMs: 300 })
    expect(Errors.describe(err as MoveDowntime)).toContain("estimate 812 ms > budget 300 ms")
    expect(await engram.sessions.get(id)).toMatchObject({ state: "running", hostId: small })
    await engram.sessions.end(id)
  })

  it("a move committed on a resolution answers the committed move with null figures (its pause not measured); one aborted by an operator is a MoveFailed naming the resolution", async () => {
    const final = { kind: "final", wireBytes: 1000, apparentBytes: 1000, sendMs: 1, captureMs: 1 }
    const inDoubt = async () => {
      const id = uid("r")
      await engram.sessions.create({ id, memMib: 512, vcpus: 1, affinity: [small] })
      await started(c.url, id)
      const moving = engram.sessions.move(id, { targetHostId: big, maxDowntimeMs: 600 }).catch((e: unknown) => e)
      const move = await pendingMove(c.url, small, id)
      expect((await call(c.url, "POST", `/v1/moves/${move.id}/rounds`, final)).status).toBe(200)
      return { id, moveId: move.id, moving }
    }
    // Before: a MoveFailed (503 MoveAborted, "aborted") for a move that committed.
    const committed = await inDoubt()
    expect((await call(c.url, "POST", `/v1/moves/${committed.moveId}/resolve`, { outcome: "commit", reason: "the target runs the guest" })).status).toBe(200)
    expect(await committed.moving).toEqual({ move: await engram.moves.get(committed.moveId), downtimeMs: null, captureMs: null, sendMs: null, commitMs: null })
    expect(await engram.sessions.get(committed.id)).toMatchObject({ state: "running", hostId: big })
    const aborted = await inDoubt()
    expect((await call(c.url, "POST", `/v1/moves/${aborted.moveId}/resolve`, { outcome: "abort", reason: "the target host is gone" })).status).toBe(200)
    const err = await aborted.moving
    expect(err).toBeInstanceOf(Errors.MoveFailed)
    expect(err).toMatchObject({ code: "MoveAborted", moveId: aborted.moveId, message: "resolved by operator: the target host is gone" })
    expect(await engram.sessions.get(aborted.id)).toMatchObject({ state: "running", hostId: small })
    await engram.sessions.end(committed.id)
    await engram.sessions.end(aborted.id)
  })

  it("a move whose source owes a resend reads resendOwed true (get, list, all) until the source clears it; an operator's resolve of it is a Conflict", async () => {
    const id = uid("o")
    await engram.sessions.create({ id, memMib: 512, vcpus: 1, affinity: [small] })
    await started(c.url, id)
    const moving = engram.sessions.move(id, { targetHostId: big, maxDowntimeMs: 600 })
    const move = await pendingMove(c.url, small, id)
    expect((await call(c.url, "POST", `/v1/moves/${move.id}/rounds`, { kind: "final", wireBytes: 1000, apparentBytes: 1000, sendMs: 1, captureMs: 1 })).status).toBe(200)
    expect((await engram.moves.resolve(move.id, "commit", "the target runs the guest")).resendOwed).toBe(false)
    await moving
    // The source's word that it holds the only copy and owes the target the stream.
    expect((await call(c.url, "POST", `/v1/moves/${move.id}/resend`, { owed: true })).status).toBe(200)
    expect(await engram.moves.get(move.id)).toMatchObject({ id: move.id, state: "committed", phases: null, resendOwed: true })
    const listed: { id: string; resendOwed: boolean }[] = []
    for await (const m of engram.moves.all({ hostId: small, state: "committed" })) listed.push(m)
    expect(listed.find((m) => m.id === move.id)?.resendOwed).toBe(true)
    expect(await engram.moves.resolve(move.id, "abort", "back to the source").catch((e: unknown) => e)).toBeInstanceOf(Conflict)
    expect((await call(c.url, "POST", `/v1/moves/${move.id}/resend`, { owed: false })).status).toBe(200)
    expect((await engram.moves.get(move.id)).resendOwed).toBe(false)
    await engram.sessions.end(id)
  })

  it("hosts: read, cordon and uncordon", async () => {
    expect(await engram.hosts.get(big)).toMatchObject({ id: big, state: "ready", measured: true, allocatableMib: 8192, cpuBudget: 32 })
    expect(await engram.hosts.cordon(big)).toMatchObject({ id: big, state: "cordoned" })
    expect(await engram.hosts.uncordon(big)).toMatchObject({ id: big, state: "ready" })
  })

  it("the fleet signal and a no-fit question", async () => {
    const fleet = await engram.fleet.snapshot()
    expect(fleet.hosts.total).toBeGreaterThanOrEqual(2)
    expect(fleet.capacityMib).toBeGreaterThanOrEqual(8192 + 4096)
    const nf = await engram.fleet.noFit({ memMib: 6000, vcpus: 1 })
    expect(nf.fits).toBe(true)
    expect(nf.hosts.find((h) => h.hostId === small)?.reason).toBe("ram_full")
  })

  it("reservations: reserve, list, release", async () => {
    const id = uid("r")
    const r = await engram.reservations.reserve({ id, hostId: big, ownerKind: "external", ownerId: "job-1", memMib: 256, vcpus: 1 })
    expect(r).toMatchObject({ id, hostId: big, memMib: 256 })
    const page = await engram.reservations.list({ hostId: big })
    expect(page.items.map((x) => x.id)).toContain(id)
    await engram.reservations.release(id)
    await expect(engram.reservations.get(id)).rejects.toBeInstanceOf(NotFound)
  })

  it("lists are pages, and `all` follows the cursors to the end", async () => {
    const ids = [uid("p"), uid("p"), uid("p")]
    for (const id of ids) await engram.sessions.create({ id, memMib: 128, vcpus: 1 })
    const page = await engram.sessions.list({ state: "pending" })
    expect(Array.isArray(page.items)).toBe(true)
    expect(page.items.map((s) => s.id)).toEqual(expect.arrayContaining(ids))
    const seen: string[] = []
    for await (const s of engram.sessions.all({ state: "pending" })) seen.push(s.id)
    expect(seen).toEqual(expect.arrayContaining(ids))
    for (const id of ids) await engram.sessions.end(id)
  })
})

describe("the Effect client", () => {
  it("fails with tagged errors that catchTag matches", async () => {
    const program = Effect.gen(function* () {
      const engramFx = yield* EngramClient
      return yield* engramFx.sessions.get("missing-one").pipe(Effect.catchTag("NotFound", (e) => Effect.succeed(`no ${e.entity} ${e.id}`)))
    }).pipe(Effect.provide(EngramClient.layerFetch({ baseUrl: c.url, token: adminToken })))
    expect(await Effect.runPromise(program)).toBe("no session missing-one")
  })

  it("listAll collects every page", async () => {
    const hosts = await Effect.runPromise(
      Effect.gen(function* () {
        return yield* (yield* EngramClient).hosts.listAll()
      }).pipe(Effect.provide(EngramClient.layerFetch({ baseUrl: c.url, token: adminToken }))),
    )
    expect(hosts.map((h) => h.id)).toEqual(expect.arrayContaining([big, small]))
  })
})

describe("pages", () => {
  it("collect follows nextCursor until null", async () => {
    const pages: Record<string, Page.Page<number>> = { start: { items: [1, 2], nextCursor: "b" }, b: { items: [3], nextCursor: "c" }, c: { items: [4], nextCursor: null } }
    const all = await Effect.runPromise(Page.collect((cursor) => Effect.succeed(pages[cursor ?? "start"] as Page.Page<number>)))
    expect(all).toEqual([1, 2, 3, 4])
  })
})

/** A client on an `HttpClient` that records each request and answers `status` with `body`. */
const recording = (status: number, body: string, contentType = "application/json") => {
  const sent: string[] = []
  const http = HttpClient.make((request, url) =>
    Effect.sync(() => {
      sent.push(`${request.method} ${url.pathname}`)
      return HttpClientResponse.fromWeb(request, new Response(body, { status, headers: { "content-type": contentType } }))
    }),
  )
  const client = Effect.runSync(make({ baseUrl: "http://engram.test", token: adminToken }).pipe(Effect.provideService(HttpClient.HttpClient, http)))
  return { client, sent }
}

/** Every call of the client once, with whatever arguments it takes. */
const everyCall = (e: EngramClientShape): Effect.Effect<unknown, unknown>[] => [
  e.sessions.create({ memMib: 1, vcpus: 1 }),
  e.sessions.get("s"),
  e.sessions.list(),
  e.sessions.idle("s"),
  e.sessions.resume("s"),
  e.sessions.end("s"),
  e.sessions.setTtl("s", 1000),
  e.sessions.move("s", { maxDowntimeMs: 1 }),
  e.sessions.wait("s", { state: "running" }),
  e.sessions.events("s"),
  e.hosts.create({ id: "h" }),
  e.hosts.get("h"),
  e.hosts.list(),
  e.hosts.cordon("h"),
  e.hosts.uncordon("h"),
  e.hosts.drain("h"),
  e.hosts.remove("h"),
  e.hosts.rotateToken("h"),
  e.hosts.allowances("h"),
  e.fleet.snapshot(),
  e.fleet.noFit({ memMib: 1, vcpus: 1 }),
  e.reservations.reserve({ hostId: "h", ownerKind: "external", ownerId: "o", memMib: 1, vcpus: 1 }),
  e.reservations.get("r"),
  e.reservations.list(),
  e.reservations.release("r"),
  e.reservations.heartbeat("r"),
  e.reservations.summary(),
  e.reservations.metrics(),
  e.moves.get("m"),
  e.moves.list(),
  e.moves.resolve("m", "abort", "operator: the source host is gone"),
  e.ready(),
]

describe("one road to the API", () => {
  const declared: { method: string; path: RegExp; route: string }[] = []
  HttpApi.reflect(EngramApi, {
    onGroup: () => {},
    onEndpoint: ({ endpoint }) =>
      void declared.push({ method: endpoint.method, route: `${endpoint.method} ${endpoint.path}`, path: new RegExp(`^${endpoint.path.replace(/:[^/]+/g, "[^/]+")}$`) }),
  })
  const routeOf = (sent: string) => declared.find((d) => sent.startsWith(`${d.method} `) && d.path.test(sent.slice(d.method.length + 1)))?.route

  it("every call is a request to an endpoint the API declares, and every endpoint a service uses has a call", async () => {
    const { client, sent } = recording(500, "{}")
    for (const call of everyCall(client)) await Effect.runPromise(Effect.ignore(call))
    const routes = sent.map((r) => routeOf(r) ?? `undeclared: ${r}`)
    expect(routes.filter((r) => r.startsWith("undeclared"))).toEqual([])
    // The agent's own endpoints and the operator's scrape and documents are not a service's calls.
    const agentOrOps = ["PUT /v1/hosts/:id/report", "POST /v1/hosts/:id/heartbeat", "POST /v1/hosts/:id/guest-lost", "GET /v1/hosts/:id/assignments", "POST /v1/sessions/:id/started", "POST /v1/sessions/:id/descended",
      "POST /v1/moves/:id/rounds", "POST /v1/moves/:id/commit", "POST /v1/moves/:id/abort", "POST /v1/moves/:id/resend", "GET /livez", "GET /healthz", "GET /openapi.json", "GET /metrics", "GET /v1/queue"]
    const uncovered = declared.map((d) => d.route).filter((r) => !routes.includes(r) && !agentOrOps.includes(r))
    expect(uncovered).toEqual([])
  })

  it("an error's status is the API's: a 408 of a wait is WaitTimeout, a 409 of a wait Unreachable", async () => {
    const timeout = recording(408, JSON.stringify({ error: "WaitTimeout", message: "the wait timed out", state: "pending" }))
    const err = await Effect.runPromise(Effect.flip(timeout.client.sessions.wait("s", { state: "running" })))
    expect(err).toBeInstanceOf(WaitTimeout)
    expect(err).toMatchObject({ status: 408, state: "pending" })
    const gone = recording(409, JSON.stringify({ error: "Unreachable", message: "the session ended", from: "ended", to: "running" }))
    expect(await Effect.runPromise(Effect.flip(gone.client.sessions.wait("s", { state: "running" })))).toMatchObject({ _tag: "Unreachable", status: 409, from: "ended" })
  })

  it("a reserve without an id is safe to repeat on the next replica: the repeat's Conflict reads the reservation and answers it when it is the one asked for; another under the id stays a Conflict", async () => {
    const asked = { hostId: "h1", ownerKind: "external" as const, ownerId: "job-7", memMib: 512, vcpus: 1 }
    /** Replica one: its store call timed out after the reserve landed (503). Replica two: the ledger holds the id (409), and reads it. */
    const replicas = (held: (id: string) => Record<string, unknown>) => {
      const sent: string[] = []
      let reservedId = ""
      const http = HttpClient.make((request, url) =>
        Effect.sync(() => {
          sent.push(`${url.host} ${request.method} ${url.pathname}`)
          const answer = (status: number, body: unknown) => HttpClientResponse.fromWeb(request, new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } }))
          if (request.method === "POST") {
            const body = (request.body as { body?: Uint8Array }).body
            reservedId = (JSON.parse(new TextDecoder().decode(body)) as { id: string }).id
            return url.host === "one.test"
              ? answer(503, { error: "Unavailable", message: "the store call timed out", retryAfterMs: 1000 })
              : answer(409, { error: "Conflict", message: `reservation ${reservedId} already exists`, entity: "reservation", id: reservedId })
          }
          return answer(200, held(reservedId))
        }),
      )
      const client = Effect.runSync(make({ baseUrl: ["http://one.test", "http://two.test"], token: adminToken }).pipe(Effect.provideService(HttpClient.HttpClient, http)))
      return { client, sent, id: () => reservedId }
    }
    const record = (id: string, ownerId: string) => ({ id, ...asked, ownerId, vramMib: null, createdAt: 1, lastHeartbeatAt: 1, expiresAt: null, description: null })
    const mine = replicas((id) => record(id, "job-7"))
    const got = await Effect.runPromise(mine.client.reservations.reserve(asked))
    expect(got).toMatchObject({ ...asked, id: mine.id() })
    expect(mine.id()).toMatch(/^[0-9a-f-]{36}$/)
    expect(mine.sent.slice(0, 2)).toEqual(["one.test POST /v1/reservations", "two.test POST /v1/reservations"])
    expect(mine.sent.slice(2).map((x) => x.split(" ").slice(1).join(" "))).toEqual([`GET /v1/reservations/${mine.id()}`])
    const theirs = replicas((id) => record(id, "someone-else"))
    const err = await Effect.runPromise(Effect.flip(theirs.client.reservations.reserve(asked)))
    expect(err).toBeInstanceOf(Conflict)
    expect(err).toMatchObject({ status: 409, entity: "reservation" })
  })

  it("a request that breaks the API's rules is refused before it is sent, in the coordinator's words: an InvalidInput naming the field, the rule and where it was (in), with no status", async () => {
    const r = recording(201, "{}")
    for (const [call, field, where] of [
      [r.client.sessions.create({ id: "..", memMib: 1, vcpus: 1 }), "id", "body"],
      [r.client.hosts.create({ id: "h/1" }), "id", "body"],
      [r.client.sessions.create({ memMib: 1, vcpus: 1, affinity: ["h1", "h1"] }), "affinity.1", "body"],
      [r.client.sessions.list({ limit: 0 }), "limit", "query"],
      [r.client.sessions.wait("s1", { state: "running", timeoutMs: -1 }), "timeoutMs", "query"],
      [r.client.hosts.list({ limit: 1001 }), "limit", "query"],
    ] as const) {
      const err = await Effect.runPromise(Effect.flip(call as Effect.Effect<unknown, unknown>))
      expect(err).toBeInstanceOf(InvalidInput)
      expect(err, `${field} in ${where}`).toMatchObject({ status: null, field, in: where, body: { error: "InvalidInput", field, in: where } })
      expect((err as InvalidInput).rule.length).toBeGreaterThan(0)
    }
    expect(r.sent).toEqual([])
  })

  it("a move from a coordinator older than resendOwed and committedBy (the fields absent) reads resendOwed false and committedBy null; a newer one's are read as sent; a resendOwed that is not a boolean, or a committedBy outside the list, is an UnexpectedAnswer", async () => {
    const older = { id: "m1", sessionId: "s1", sourceHostId: "a", targetHostId: "b", reservationId: "r1", maxDowntimeMs: 600, state: "committed", rounds: [], phases: null, abortReason: null, abortEstimateMs: null, createdAt: 1, endedAt: 2 }
    const run = <A>(e: Effect.Effect<A, unknown>) => Effect.runPromise(e)
    const old = recording(200, JSON.stringify(older))
    const read = { ...older, resendOwed: false, committedBy: null }
    expect(await run(old.client.moves.get("m1"))).toEqual(read)
    expect(await run(old.client.moves.resolve("m1", "commit", "the target runs the guest"))).toEqual(read)
    const oldPage = recording(200, JSON.stringify({ items: [older], nextCursor: null }))
    expect((await run(oldPage.client.moves.list())).items).toEqual([read])
    expect(await run(oldPage.client.moves.listAll())).toEqual([read])
    for (const owed of [true, false]) {
      const newer = recording(200, JSON.stringify({ ...older, resendOwed: owed }))
      expect(await run(newer.client.moves.get("m1"))).toEqual({ ...read, resendOwed: owed })
    }
    for (const by of ["source", "target", "operator", null]) {
      const newer = recording(200, JSON.stringify({ ...older, resendOwed: false, committedBy: by }))
      expect(await run(newer.client.moves.get("m1"))).toEqual({ ...read, committedBy: by })
    }
    for (const wrong of [{ resendOwed: "yes" }, { committedBy: "agent" }]) {
      const bad = recording(200, JSON.stringify({ ...older, ...wrong }))
      expect(await Effect.runPromise(Effect.flip(bad.client.moves.get("m1"))), JSON.stringify(wrong)).toBeInstanceOf(UnexpectedAnswer)
    }
  })

  it("a status the API does not declare for the call is read as it came; an answer that is not JSON says so", async () => {
    const teapot = recording(418, JSON.stringify({ error: "Teapot", message: "short and stout" }))
    const err = await Effect.runPromise(Effect.flip(teapot.client.sessions.wait("s", { state: "running" })))
    expect(err).toBeInstanceOf(UnexpectedAnswer)
    expect(err).toMatchObject({ status: 418, code: "Teapot" })
    // A wait's 429 (too many open long-polls) is declared: it says when to try again.
    const busy = recording(429, JSON.stringify({ error: "TooManyWaits", message: "too many open waits for this token", limit: 4, retryAfterMs: 1000 }))
    const refused = await Effect.runPromise(Effect.flip(busy.client.sessions.wait("s", { state: "running" })))
    expect(refused).toBeInstanceOf(TooManyRequests)
    expect(refused).toMatchObject({ status: 429, code: "TooManyWaits", limit: 4, retryAfterMs: 1000 })
    // A 2xx whose body is not the API's: not the caller's bad input.
    const odd = recording(200, JSON.stringify({ nope: 1 }))
    const undecodable = await Effect.runPromise(Effect.flip(odd.client.sessions.get("s")))
    expect(undecodable).toBeInstanceOf(UnexpectedAnswer)
    expect(odd.sent).toEqual(["GET /v1/sessions/s"])
    const proxy = recording(502, "<html>bad gateway</html>", "text/html")
    const html = await Effect.runPromise(Effect.flip(proxy.client.fleet.snapshot()))
    expect(html).toBeInstanceOf(UnexpectedAnswer)
    expect(html.message).toContain("is http://engram.test an engram coordinator?")
  })
})
