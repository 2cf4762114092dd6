/**
 * A minimal HTTP/1.1 client over raw keep-alive sockets, for the fleet bench's agents: a
 * request is one `write` of its bytes and its answer is parsed from the socket's data (status,
 * `content-length` or chunked body), with no `http.Agent`, `IncomingMessage`, stream or header
 * object per request. 10,000 agents then cost the generator a socket and a few small objects
 * each, so what the bench measures is the coordinator, not its load generator.
 */
import { connect } from "node:net"
import type { Socket } from "node:net"

export interface Target {
  readonly host: string
  readonly port: number
}

export interface Answer {
  readonly status: number
  readonly body: string
  /** How long (ms) the request waited in this process before its bytes were written: the pool's queue (every connection busy). */
  readonly queuedMs: number
  /** How long (ms) from its bytes written to its answer parsed: what the server (and this process's turn to read) took. */
  readonly answerMs: number
  /** Whether it was the first request of a connection opened for it (its time then includes the server's accepting it). */
  readonly fresh: boolean
}

interface Pending {
  readonly bytes: string
  /** `performance.now()` when asked for. */
  readonly asked: number
  /** `performance.now()` when its bytes were written. */
  written: number
  fresh: boolean
  readonly resolve: (a: Answer) => void
  readonly reject: (e: Error) => void
}

const CRLF2 = Buffer.from("\r\n\r\n")

/** One keep-alive connection: one request at a time, reconnected after a close. */
class Connection {
  private socket: Socket | null = null
  private data: Buffer = Buffer.alloc(0)
  private current: Pending | null = null
  constructor(
    private readonly target: Target,
    private readonly onIdle: (c: Connection) => void,
  ) {}

  send(p: Pending): void {
    this.current = p
    p.fresh = this.socket === null
    if (this.socket === null) this.open()
    p.written = performance.now()
    ;(this.socket as Socket).write(p.bytes)
  }

  close(): void {
    this.socket?.destroy()
    this.socket = null
  }

  private open(): void {
    const s = connect(this.target.port, this.target.host)
    s.setNoDelay(true)
    this.socket = s
    this.data = Buffer.alloc(0)
    s.on("data", (chunk: Buffer) => {
      this.data = this.data.length === 0 ? chunk : Buffer.concat([this.data, chunk])
      this.parse()
    })
    const lost = (e?: Error) => {
      if (this.socket !== s) return
      this.socket = null
      const p = this.current
      this.current = null
      if (p !== null) {
        p.reject(e ?? new Error("connection closed"))
        this.onIdle(this)
      }
    }
    s.on("error", lost)
    s.on("close", () => lost())
  }

  private parse(): void {
    const p = this.current
    if (p === null) return
    const end = this.data.indexOf(CRLF2)
    if (end < 0) return
    const head = this.data.toString("latin1", 0, end)
    const status = Number(head.slice(9, 12))
    const lower = head.toLowerCase()
    const start = end + 4
    let body: string
    let rest: number
    const cl = /\r\ncontent-length:\s*(\d+)/.exec(lower)
    if (cl !== null) {
      rest = start + Number(cl[1])
      if (this.data.length < rest) return
      body = this.data.toString("utf8", start, rest)
    } else if (lower.includes("\r\ntransfer-encoding: chunked")) {
      const parts: Buffer[] = []
      let at = start
      for (;;) {
        const eol = this.data.indexOf("\r\n", at)
        if (eol < 0) return
        const size = parseInt(this.data.toString("latin1", at, eol), 16)
        if (this.data.length < eol + 2 + size + 2) return
        if (size === 0) {
          rest = eol + 4
          break
        }
        parts.push(this.data.subarray(eol + 2, eol + 2 + size))
        at = eol + 2 + size + 2
      }
      body = Buffer.concat(parts).toString("utf8")
    } else {
      rest = start
      body = ""
    }
    this.data = this.data.subarray(rest)
    this.current = null
    if (lower.includes("\r\nconnection: close")) this.close()
    p.resolve({ status, body, queuedMs: p.written - p.asked, answerMs: performance.now() - p.written, fresh: p.fresh })
    this.onIdle(this)
  }
}

/** Up to `size` keep-alive connections to `target`; requests beyond them wait their turn. */
export class Pool {
  private readonly idle: Connection[] = []
  private readonly queue: Pending[] = []
  private opened = 0
  private readonly all: Connection[] = []
  constructor(
    private readonly target: Target,
    private readonly size: number,
  ) {}

  request(method: string, path: string, token: string, body?: string): Promise<Answer> {
    const extra = body === undefined ? "" : `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n`
    const bytes = `${method} ${path} HTTP/1.1\r\nhost: ${this.target.host}:${this.target.port}\r\nauthorization: Bearer ${token}\r\n${extra}\r\n${body ?? ""}`
    return new Promise<Answer>((resolve, reject) => {
      const p: Pending = { bytes, asked: performance.now(), written: 0, fresh: false, resolve, reject }
      const c = this.idle.pop() ?? (this.opened < this.size ? this.make() : null)
      if (c === null) this.queue.push(p)
      else c.send(p)
    })
  }

  destroy(): void {
    for (const c of this.all) c.close()
  }

  private make(): Connection {
    this.opened++
    const c = new Connection(this.target, (free) => {
      const next = this.queue.shift()
      if (next !== undefined) free.send(next)
      else this.idle.push(free)
    })
    this.all.push(c)
    return c
  }
}
