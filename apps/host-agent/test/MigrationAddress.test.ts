/**
 * The address a move's source is told to stream to when the data plane listens on a wildcard.
 * Before, an agent whose data plane listened on `0.0.0.0` with only a peer URL (or its
 * `ENGRAM_PEERS` entry) told sources `tcp:0.0.0.0:<port>`, which each source dialled on itself:
 * the host advertised a peer URL, so the reaper picked it as a target, and every move to it
 * failed. Real HTTP: a prepare to the agent's own peer server, as a source sends it.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { startHostAgent } from "../src/Host.js"
import * as PeerLink from "../src/PeerLink.js"
import { makeFakeCoordinator } from "./support/FakeCoordinator.js"
import { freePort } from "./support/E2e.js"

const secret = "migration-address-secret-0123"
const measure = () => Effect.succeed({ totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 })
const header = { moveId: "m1", sessionId: "s1", sourceHostId: "src", targetHostId: "t", memMib: 64, vcpus: 1 }

describe("the address a move's source is told (PeerLink.migrationAdvertiseHostOf)", () => {
  it("the advertise host when given; the listen host unless a wildcard; else the peer URL's host; else the wildcard", () => {
    const of = PeerLink.migrationAdvertiseHostOf
    assert.strictEqual(of("0.0.0.0", "host-b.internal", "http://10.0.0.9:7400"), "host-b.internal")
    assert.strictEqual(of("10.0.0.2", undefined, "http://10.0.0.9:7400"), "10.0.0.2")
    assert.strictEqual(of("0.0.0.0", undefined, "http://host-b.internal:7400"), "host-b.internal")
    assert.strictEqual(of("::", undefined, "https://[fd00::7]:7400"), "fd00::7")
    // A peer URL that names no reachable host (`http://0:7400` is 0.0.0.0) leaves the wildcard.
    assert.strictEqual(of("0.0.0.0", undefined, "http://0:7400"), "0.0.0.0")
    assert.strictEqual(of("0.0.0.0", undefined, null), "0.0.0.0")
    assert.strictEqual(of("0.0.0.0", undefined, undefined), "0.0.0.0")
    assert.strictEqual(of("0.0.0.0", undefined, "not a url"), "0.0.0.0")
  })

  const prepareAt = (o: { readonly peerUrl?: string; readonly ownEntry?: boolean }) =>
    Effect.scoped(
      Effect.gen(function* () {
        const port = yield* Effect.promise(freePort)
        const url = `http://127.0.0.1:${port}`
        const coordinator = yield* makeFakeCoordinator
        yield* startHostAgent({
          hostId: "t",
          coordinator: coordinator.client("t"),
          peerSecret: secret,
          peers: (id) => (o.ownEntry === true && id === "t" ? url : undefined),
          ...(o.peerUrl === undefined ? {} : { peerUrl: o.peerUrl }),
          listen: { port, host: "0.0.0.0" },
          migration: { listenHost: "0.0.0.0" },
          measure,
          sim: { startMs: 5 },
          config: { retryDelayMs: 20, pollWaitMs: 0 },
        })
        return yield* PeerLink.http(() => url, secret).prepare(header)
      }),
    )

  it.live("a data plane on 0.0.0.0 with ENGRAM_AGENT_PEER_URL alone: the prepare's endpoint names the peer URL's host", () =>
    Effect.gen(function* () {
      const endpoint = yield* prepareAt({ peerUrl: "http://127.0.0.1:1" })
      assert.match(endpoint.uri, /^tcp:127\.0\.0\.1:\d+$/)
    }), 30_000)

  it.live("a data plane on 0.0.0.0 with its own ENGRAM_PEERS entry alone: the same", () =>
    Effect.gen(function* () {
      const endpoint = yield* prepareAt({ ownEntry: true })
      assert.match(endpoint.uri, /^tcp:127\.0\.0\.1:\d+$/)
    }), 30_000)
})
