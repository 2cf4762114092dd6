// Answers of a newer coordinator: a no-fit reason this release does not know (a reason is added
// now and then: `silent` was) is decoded as the string it came as, not refused with the whole
// answer. A plain Node server answers by hand, as a newer coordinator would.
import { Records } from "@engram/api"
import { createServer } from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { createClient } from "../src/index.js"

const detail = (hostId: string, reason: string) => ({ hostId, reason, freeMib: 1024, freeVcpus: 4 })
const noFit = [detail("h1", "brand-new-reason"), detail("h2", "ram_full")]

const server = createServer((req, res) => {
  req.resume()
  req.on("end", () => {
    const json = (status: number, value: unknown) => res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(value))
    if (req.method === "POST" && req.url === "/v1/sessions") return json(202, { id: "q1", state: "queued", position: 1, noFit, tooBig: false })
    if (req.url?.startsWith("/v1/placement/no-fit")) return json(200, { fits: false, hosts: noFit })
    return json(404, { error: "NotFound", entity: "route", id: `${req.method} ${req.url}`, message: "no such route" })
  })
})
let baseUrl = ""
beforeAll(async () => {
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r))
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(() => new Promise<void>((r) => server.close(() => r())))

/** What a caller does with a reason: switch on the known ones, keep the rest as text. */
const describeReason = (reason: Records.NoFitReason): string => {
  switch (reason) {
    case "ram_full":
      return "not enough RAM"
    case "silent":
      return "agent silent"
    default:
      return Records.isKnownNoFitReason(reason) ? reason : `unknown to this client: ${reason}`
  }
}

describe("a no-fit reason this client does not know", () => {
  it("a 202 carrying reason brand-new-reason decodes, the reason kept as it came", async () => {
    const engram = createClient({ baseUrl, token: "a-secret-token-0123456789" })
    const queued = await engram.sessions.create({ id: "q1", memMib: 1024, vcpus: 1 })
    expect(queued).toMatchObject({ outcome: "queued", id: "q1", position: 1 })
    if (queued.outcome !== "queued") return
    expect(queued.noFit.map((d) => [d.hostId, d.reason])).toEqual([
      ["h1", "brand-new-reason"],
      ["h2", "ram_full"],
    ])
    expect(queued.noFit.map((d) => describeReason(d.reason))).toEqual(["unknown to this client: brand-new-reason", "not enough RAM"])
    // The no-fit details read alone decode the same way.
    expect((await engram.fleet.noFit({ memMib: 1024, vcpus: 1 })).hosts.map((d) => d.reason)).toEqual(["brand-new-reason", "ram_full"])
  })

  it("the known reasons are told apart from the rest", () => {
    expect(Records.knownNoFitReasons).toContain("silent")
    expect(Records.isKnownNoFitReason("ram_full")).toBe(true)
    expect(Records.isKnownNoFitReason("brand-new-reason")).toBe(false)
  })
})
