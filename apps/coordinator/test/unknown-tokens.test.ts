// A token that finds no host (a revoked one, or a bearer never issued) costs at most one store
// read per `unknownCredentialTtlMs` on a replica, however often it is presented: before, each of
// its requests read the store (a decommissioned agent that keeps calling, or garbage bearers,
// put a statement per request on the database). It is still never accepted, and a token issued
// anywhere (a registration's or a rotation's credential notice) authenticates at once, even if
// its hash was kept as unknown. Real HTTP, a real coordinator on the test's clock (`TestClock`
// moves the kept entries past their time); the notices are this process's own, so a test can
// issue a credential as another replica would (the store's write, then its notice).
import { assert, describe, it } from "@effect/vitest"
import { Changes, makeHub, Store } from "@engram/store"
import type { StoreShape } from "@engram/store"
import { StoreSim } from "@engram/store-sim"
import { Context, Effect, Fiber, Layer } from "effect"
import { TestClock } from "effect/testing"
import { Credentials, hashToken, maxUnknownCredentials, newToken, unknownCredentialTtlMs } from "../src/Auth.js"
import { credentialTopic } from "../src/Notifier.js"
import { clockedCoordinator } from "./support/clocked.js"
import { client } from "./support/http.js"

const adminToken = "unknown-tokens-admin-token-0123456789"

/** A coordinator on a counting in-memory store, with notices a test can send as another replica. */
const setup = Effect.gen(function* () {
  const hub = makeHub()
  const changes = Layer.succeed(Changes, Changes.of({ publish: (topics) => Effect.sync(() => hub.deliver([...new Set(topics)])), subscribe: hub.subscribe, live: () => true }))
  const counts = { tokenReads: 0 }
  /** When set, a read of a token's host answers, then waits for it before it returns (a read a notice overtakes). */
  const hold: { current: { readonly entered: () => void; readonly release: Promise<void> } | null } = { current: null }
  let inner: StoreShape | undefined
  const store = Layer.effect(
    Store,
    Effect.map(Store, (s) => {
      inner = s
      const { hostTokenHashes, ...rest } = s
      return Store.of({
        ...rest,
        hostByTokenHash: (hash) =>
          Effect.suspend(() => {
            counts.tokenReads++
            const held = hold.current
            return held === null ? s.hostByTokenHash(hash) : Effect.tap(s.hostByTokenHash(hash), () => Effect.andThen(Effect.sync(held.entered), Effect.promise(() => held.release)))
          }),
        ...(hostTokenHashes === undefined ? {} : { hostTokenHashes: (ids: readonly string[]) => Effect.suspend(() => (counts.tokenReads++, hostTokenHashes(ids))) }),
      })
    }),
  ).pipe(Layer.provide(StoreSim.layer()))
  const { url, context } = yield* clockedCoordinator({ store, changes, reaper: false, config: { port: 0, adminToken } })
  const admin = client(url, adminToken)
  /** The status of a request that authenticates with `token` (a host's own view). */
  const status = (token: string, hostId = "h1") => Effect.promise(() => client(url, token).get(`/v1/hosts/${hostId}`)).pipe(Effect.map((a) => a.status))
  /** How many store reads of a credential `work` made. */
  const readsOf = <A, E, R>(work: Effect.Effect<A, E, R>) =>
    Effect.map(Effect.zip(Effect.sync(() => counts.tokenReads), Effect.flatMap(work, (a) => Effect.map(Effect.sync(() => counts.tokenReads), (after) => [a, after] as const))), ([before, [a, after]]) => ({ answer: a, reads: after - before }))
  /** Issues `token` to a host as another replica does: the store's write, then the credential notice every replica hears. */
  const issueElsewhere = (hostId: string, token: string, notice = true) =>
    Effect.andThen(
      (inner as StoreShape).registerHost({ id: hostId, tokenHash: hashToken(token) }),
      Effect.sync(() => (notice ? hub.deliver([credentialTopic(hostId)]) : undefined)),
    )
  const registered = yield* Effect.promise(() => admin.post("/v1/hosts", { id: "h1" }))
  assert.strictEqual(registered.status, 201)
  return { url, context, admin, status, readsOf, issueElsewhere, hold, token: registered.body.token as string }
})

/** `n` requests with `token`, one after the other: their statuses. */
const repeated = (n: number, request: Effect.Effect<number>) => Effect.forEach(Array.from({ length: n }), () => request)

describe("tokens that find no host", () => {
  it.effect("a revoked token, and a garbage bearer, presented again and again: 401 each time, one store read each", () =>
    Effect.gen(function* () {
      const { admin, status, readsOf, token } = yield* setup
      assert.strictEqual(yield* status(token), 200)
      const rotated = yield* Effect.promise(() => admin.post("/v1/hosts/h1/token"))
      assert.strictEqual(rotated.status, 200)
      const revoked = yield* readsOf(repeated(30, status(token)))
      assert.deepStrictEqual(revoked, { answer: Array.from({ length: 30 }, () => 401), reads: 1 })
      const garbage = yield* readsOf(repeated(30, status("not-a-token-anyone-was-given")))
      assert.deepStrictEqual(garbage, { answer: Array.from({ length: 30 }, () => 401), reads: 1 })
      // The rotated token acts (read once, then kept as the host's).
      assert.deepStrictEqual(yield* readsOf(repeated(3, status(rotated.body.token as string))), { answer: [200, 200, 200], reads: 1 })
    }).pipe(Effect.scoped),
  )

  it.effect("a token kept as unknown is read again once its time has passed (TestClock), then kept again", () =>
    Effect.gen(function* () {
      const { status, readsOf } = yield* setup
      const garbage = "garbage-bearer-0123456789"
      assert.deepStrictEqual(yield* readsOf(status(garbage)), { answer: 401, reads: 1 })
      yield* TestClock.adjust(unknownCredentialTtlMs - 1)
      assert.deepStrictEqual(yield* readsOf(status(garbage)), { answer: 401, reads: 0 })
      yield* TestClock.adjust(1)
      assert.deepStrictEqual(yield* readsOf(repeated(5, status(garbage))), { answer: [401, 401, 401, 401, 401], reads: 1 })
    }).pipe(Effect.scoped),
  )

  it.effect("a token kept as unknown authenticates at once once issued elsewhere (the credential notice); without the notice, once its time has passed", () =>
    Effect.gen(function* () {
      const { status, readsOf, issueElsewhere } = yield* setup
      const early = newToken()
      assert.deepStrictEqual(yield* readsOf(repeated(3, status(early, "h2"))), { answer: [401, 401, 401], reads: 1 })
      yield* issueElsewhere("h2", early)
      assert.strictEqual(yield* status(early, "h2"), 200)
      // A write whose notice this replica never heard (an operator's, outside any coordinator):
      // refused from memory for at most the time it is kept, then read and accepted.
      const unheard = newToken()
      assert.strictEqual(yield* status(unheard, "h3"), 401)
      yield* issueElsewhere("h3", unheard, false)
      assert.strictEqual(yield* status(unheard, "h3"), 401)
      yield* TestClock.adjust(unknownCredentialTtlMs)
      assert.strictEqual(yield* status(unheard, "h3"), 200)
    }).pipe(Effect.scoped),
  )

  it.effect("a read that found no host, overtaken by the token's issuance, keeps nothing: the next request is accepted", () =>
    Effect.gen(function* () {
      const { status, issueElsewhere, hold } = yield* setup
      const token = newToken()
      let entered = () => {}
      const inRead = new Promise<void>((r) => (entered = r))
      let release = () => {}
      hold.current = { entered: () => entered(), release: new Promise<void>((r) => (release = r)) }
      const first = yield* Effect.forkChild(status(token, "h4"))
      yield* Effect.promise(() => inRead)
      hold.current = null
      // The read answered "no host"; the issuance and its notice come before the answer is used.
      yield* issueElsewhere("h4", token)
      release()
      assert.strictEqual(yield* Fiber.join(first), 401)
      assert.strictEqual(yield* status(token, "h4"), 200)
    }).pipe(Effect.scoped),
  )

  it.effect("at most maxUnknownCredentials are kept: the oldest goes first", () =>
    Effect.gen(function* () {
      const { context, readsOf } = yield* setup
      const credentials = Context.get(context, Credentials)
      const hashes = Array.from({ length: maxUnknownCredentials + 1 }, (_, i) => hashToken(`garbage-${i}`))
      yield* Effect.forEach(hashes, (h) => credentials.principalOf(h), { discard: true })
      assert.strictEqual(credentials.unknownCached(), maxUnknownCredentials)
      // The newest is kept, the oldest went.
      assert.deepStrictEqual(yield* readsOf(credentials.principalOf(hashes[maxUnknownCredentials] as string)), { answer: null, reads: 0 })
      assert.deepStrictEqual(yield* readsOf(credentials.principalOf(hashes[0] as string)), { answer: null, reads: 1 })
    }).pipe(Effect.scoped),
  )
})
