/**
 * The HTTP peer link's address of a target: the operator's `ENGRAM_PEERS` entry (an override),
 * else the URL the coordinator gave with a move to it (`learn`), else none (the call fails
 * without a request). Over real HTTP to two small servers that say which one was asked.
 */
import { createServer, type Server } from "node:http"
import { Effect, Exit } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as PeerLink from "../src/PeerLink.js"

const header = { moveId: "m1", sessionId: "s1", sourceHostId: "a", targetHostId: "b", memMib: 256, vcpus: 1 }
const servers: Server[] = []
const urls: Record<string, string> = {}

/** A peer server stand-in answering each prepare with its own name as the endpoint. */
const serve = (name: string) =>
  new Promise<string>((resolve) => {
    const s = createServer((_req, res) => {
      res.setHeader("content-type", "application/json")
      res.end(JSON.stringify({ endpoint: { runtime: "sim", uri: name } }))
    })
    servers.push(s)
    s.listen(0, "127.0.0.1", () => {
      const a = s.address()
      resolve(`http://127.0.0.1:${typeof a === "object" && a !== null ? a.port : 0}`)
    })
  })

beforeAll(async () => {
  urls.override = await serve("override")
  urls.learned = await serve("learned")
})
afterAll(() => Promise.all(servers.map((s) => new Promise((r) => s.close(r)))))

const prepare = (link: PeerLink.PeerLink) => Effect.runPromiseExit(link.prepare(header))

describe("where the HTTP link reaches a move's target", () => {
  it("with neither an ENGRAM_PEERS entry nor a learned URL: fails naming the peer", async () => {
    const exit = await prepare(PeerLink.http(() => undefined, "peer-link-secret-0123"))
    expect(Exit.isFailure(exit) && JSON.stringify(exit.cause)).toContain("no address for peer b")
  })

  it("at the URL the coordinator gave with the move; a null forgets it", async () => {
    const link = PeerLink.http(() => undefined, "peer-link-secret-0123")
    await Effect.runPromise(link.learn!("b", urls.learned!))
    const exit = await prepare(link)
    expect(Exit.isSuccess(exit) && exit.value.uri).toBe("learned")
    await Effect.runPromise(link.learn!("b", null))
    expect(JSON.stringify(await prepare(link))).toContain("no address for peer b")
  })

  it("the operator's ENGRAM_PEERS entry wins over the learned URL", async () => {
    const peers = PeerLink.parsePeers(`b=${urls.override}`)
    const link = PeerLink.http((id) => peers.get(id), "peer-link-secret-0123")
    await Effect.runPromise(link.learn!("b", urls.learned!))
    const exit = await prepare(link)
    expect(Exit.isSuccess(exit) && exit.value.uri).toBe("override")
  })
})
