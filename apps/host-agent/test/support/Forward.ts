/**
 * A test proxy's way on to its upstream coordinator: the request read whole, sent on with its
 * bearer (and its JSON body, if any), the upstream's status and body answered back; 502 when the
 * upstream cannot be reached. `before` sees the request once its body is read and answers true
 * when it answered the request itself.
 */
import type { IncomingMessage, ServerResponse } from "node:http"

export const forwardTo = (upstream: string, req: IncomingMessage, res: ServerResponse, before?: (req: IncomingMessage, res: ServerResponse) => boolean): void => {
  let body = ""
  req.on("data", (c: Buffer) => (body += c.toString()))
  req.on("end", () => {
    if (before?.(req, res) === true) return
    const headers: Record<string, string> = { authorization: req.headers.authorization ?? "" }
    if (body !== "") headers["content-type"] = "application/json"
    void fetch(`${upstream}${req.url}`, { method: req.method!, headers, ...(body === "" ? {} : { body }) }).then(
      async (r) => res.writeHead(r.status, { "content-type": "application/json" }).end(await r.text()),
      () => res.writeHead(502).end(),
    )
  })
}
