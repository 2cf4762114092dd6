/**
 * A peer whose answer has no end in sight: `200`, then a JSON text whose `pad` string runs to
 * `totalBytes` in all, chunked (no declared length), written as fast as the client reads it. It
 * says how much it wrote before the client closed the connection, and whether it got to the end.
 */
import { createServer, type IncomingMessage } from "node:http"

export interface Flood {
  readonly port: number
  /** The first request's end: the bytes written, and whether the whole answer was. */
  readonly ended: Promise<{ readonly sentBytes: number; readonly finished: boolean }>
  readonly close: () => void
}

/** `answer(req)`: the JSON object's other keys (the proof, made from the request). */
export const floodingPeer = (answer: (req: IncomingMessage) => Record<string, unknown>, totalBytes: number): Promise<Flood> =>
  new Promise((resolve) => {
    let ended!: (e: { sentBytes: number; finished: boolean }) => void
    const endedP = new Promise<{ sentBytes: number; finished: boolean }>((r) => (ended = r))
    const server = createServer((req, res) => {
      req.resume()
      const head = `${JSON.stringify(answer(req)).slice(0, -1)},"pad":"`
      const tail = '"}'
      const padBytes = totalBytes - head.length - tail.length
      const chunk = Buffer.alloc(64 * 1024, "x")
      let sent = 0
      let padded = 0
      res.on("close", () => ended({ sentBytes: sent, finished: res.writableFinished }))
      res.writeHead(200, { "content-type": "application/json" })
      res.write(head)
      sent += head.length
      const pump = () => {
        while (padded < padBytes) {
          const n = Math.min(chunk.length, padBytes - padded)
          padded += n
          sent += n
          if (!res.write(n === chunk.length ? chunk : chunk.subarray(0, n))) return void res.once("drain", pump)
        }
        sent += tail.length
        res.end(tail)
      }
      pump()
    })
    server.listen(0, "127.0.0.1", () => {
      const a = server.address()
      resolve({ port: typeof a === "object" && a !== null ? a.port : 0, ended: endedP, close: () => (server.closeAllConnections(), server.close()) })
    })
  })
