/**
 * The HTTP peer link's address of a target: the operator's `ENGRAM_PEERS` entry (an override),
 * else where the move was prepared (or pinned), else the URL the coordinator gave with a move to
 * it (`learn`), else none (the call fails without a request). And the target's proof in its
 * prepare answer: required at a URL from the coordinator, checked when present at the operator's.
 * Over real HTTP to small servers that say which one was asked.
 */
import { createServer, type Server } from "node:http"
import { Effect, Exit } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { prepareProof } from "../src/MoveToken.js"
import * as PeerLink from "../src/PeerLink.js"
import { floodingPeer } from "./support/Flood.js"

const secret = "peer-link-secret-0123"
const header = { moveId: "m1", sessionId: "s1", sourceHostId: "a", targetHostId: "b", memMib: 256, vcpus: 1 }
const servers: Server[] = []
const urls: Record<string, string> = {}

/**
 * A peer server stand-in answering each prepare with its own name as the endpoint, and with the
 * target's proof made with `proofSecret` (null: no proof); any other request with its name.
 */
const serve = (name: string, proofSecret: string | null = secret) =>
  new Promise<string>((resolve) => {
    const s = createServer((req, res) => {
      let body = ""
      req.on("data", (c: Buffer) => (body += c.toString()))
      req.on("end", () => {
        res.setHeader("content-type", "application/json")
        const h = JSON.parse(body) as typeof header
        const endpoint = { runtime: "sim", uri: name }
        if (!(req.url ?? "").endsWith("/prepare")) return void res.end(JSON.stringify({ ok: true, by: name }))
        res.end(JSON.stringify({ endpoint, ...(proofSecret === null ? {} : { proof: prepareProof(proofSecret, h.moveId, h.sourceHostId, h.targetHostId, endpoint) }) }))
      })
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
  urls.unproven = await serve("unproven", null)
  urls.otherFleet = await serve("other fleet", "another-fleet-secret-0123")
})
afterAll(() => Promise.all(servers.map((s) => new Promise((r) => s.close(r)))))

const prepare = (link: PeerLink.PeerLink) => Effect.runPromiseExit(link.prepare(header))

describe("where the HTTP link reaches a move's target", () => {
  it("with neither an ENGRAM_PEERS entry nor a learned URL: fails naming the peer", async () => {
    const exit = await prepare(PeerLink.http(() => undefined, secret))
    expect(Exit.isFailure(exit) && JSON.stringify(exit.cause)).toContain("no address for peer b")
  })

  it("at the URL the coordinator gave with the move; a null forgets it", async () => {
    const link = PeerLink.http(() => undefined, secret)
    await Effect.runPromise(link.learn!("b", urls.learned!))
    const exit = await prepare(link)
    expect(Exit.isSuccess(exit) && exit.value.uri).toBe("learned")
    await Effect.runPromise(link.learn!("b", null))
    // Another move (this one is reached where it was prepared, below).
    expect(JSON.stringify(await Effect.runPromiseExit(link.prepare({ ...header, moveId: "m2" })))).toContain("no address for peer b")
  })

  it("the operator's ENGRAM_PEERS entry wins over the learned URL", async () => {
    const peers = PeerLink.parsePeers(`b=${urls.override}`)
    const link = PeerLink.http((id) => peers.get(id), secret)
    await Effect.runPromise(link.learn!("b", urls.learned!))
    const exit = await prepare(link)
    expect(Exit.isSuccess(exit) && exit.value.uri).toBe("override")
  })

  it("a move's later calls go where it was prepared, though the coordinator gives another URL since; addressOf names it", async () => {
    const link = PeerLink.http(() => undefined, secret)
    await Effect.runPromise(link.learn!("b", urls.learned!))
    await Effect.runPromise(link.prepare(header))
    await Effect.runPromise(link.learn!("b", urls.override!))
    expect(link.addressOf!(header)).toBe(urls.learned)
    expect(link.addressOf!({ ...header, moveId: "m2" })).toBe(urls.override)
  })

  it("a move pinned (a restarted source's owed move) is reached at its pin; ENGRAM_PEERS still wins", async () => {
    const link = PeerLink.http(() => undefined, secret)
    await Effect.runPromise(link.pin!("m1", urls.learned!))
    expect(link.addressOf!(header)).toBe(urls.learned)
    const peers = PeerLink.parsePeers(`b=${urls.override}`)
    const pinnedToo = PeerLink.http((id) => peers.get(id), secret)
    await Effect.runPromise(pinnedToo.pin!("m1", urls.learned!))
    expect(pinnedToo.addressOf!(header)).toBe(urls.override)
  })
})

describe("the target proves it holds the peer secret in its prepare answer", () => {
  const learnedAt = async (url: string) => {
    const link = PeerLink.http(() => undefined, secret)
    await Effect.runPromise(link.learn!("b", url))
    return link
  }

  it("at a URL from the coordinator: an answer without a proof is refused, naming it", async () => {
    const exit = await prepare(await learnedAt(urls.unproven!))
    expect(Exit.isFailure(exit) && JSON.stringify(exit.cause)).toContain("without a proof that it holds the peer secret")
  })

  it("at a URL from the coordinator: a proof made with another secret is refused", async () => {
    const exit = await prepare(await learnedAt(urls.otherFleet!))
    expect(Exit.isFailure(exit) && JSON.stringify(exit.cause)).toContain("wrong proof")
  })

  it("a proof of another move (or endpoint) is refused", () => {
    const endpoint = { runtime: "sim", uri: "x" }
    const proof = prepareProof(secret, "m2", "a", "b", endpoint)
    expect(PeerLink.proofProblem(secret, header, { endpoint, proof }, false)).toContain("wrong proof")
    expect(PeerLink.proofProblem(secret, header, { endpoint: { runtime: "sim", uri: "y" }, proof: prepareProof(secret, "m1", "a", "b", endpoint) }, true)).toContain("wrong proof")
    expect(PeerLink.proofProblem(secret, header, { endpoint, proof: prepareProof(secret, "m1", "a", "b", endpoint) }, false)).toBeUndefined()
  })

  it("at the operator's ENGRAM_PEERS entry: an answer without a proof (an older target) is taken, a wrong one is not", async () => {
    const at = (url: string) => PeerLink.http((id) => (id === "b" ? url : undefined), secret)
    const old = await prepare(at(urls.unproven!))
    expect(Exit.isSuccess(old) && old.value.uri).toBe("unproven")
    const wrong = await prepare(at(urls.otherFleet!))
    expect(Exit.isFailure(wrong) && JSON.stringify(wrong.cause)).toContain("wrong proof")
  })
})

describe("a target's answer is read with a bound in bytes", () => {
  it("a prepare answered with more than peerAnswerMaxBytes fails naming the bound, the rest never read (the connection cut), though its proof is good", async () => {
    const endpoint = { runtime: "sim", uri: "flood" }
    const total = 64 * 1024 * 1024
    const peer = await floodingPeer(() => ({ endpoint, proof: prepareProof(secret, "m1", "a", "b", endpoint) }), total)
    try {
      const link = PeerLink.http(() => undefined, secret)
      await Effect.runPromise(link.learn!("b", `http://127.0.0.1:${peer.port}`))
      const exit = await prepare(link)
      expect(Exit.isFailure(exit) && JSON.stringify(exit.cause)).toContain(`answered the prepare with more than ${PeerLink.peerAnswerMaxBytes} bytes`)
      const ended = await peer.ended
      expect(ended.finished).toBe(false)
      expect(ended.sentBytes).toBeLessThan(total)
    } finally {
      peer.close()
    }
  }, 120_000)
})
