/**
 * The recorded history of a client's operations against a coordinator: each operation's kind,
 * request, answer (status and body, or none when it failed or timed out) and its start and end
 * times. `Recorder` makes the requests over real HTTP, each with a bound, and keeps the history
 * the checker reads.
 */

/** What an operation did, for the checker: creates and ends of sessions, and everything else. */
export type OpKind = "create" | "end" | "read" | "other"

/** One client operation as it happened. */
export interface Op {
  readonly kind: OpKind
  /** The session (or host) id the operation names; null when it names none. */
  readonly id: string | null
  readonly method: string
  readonly path: string
  readonly body: unknown
  /** The HTTP status, or null when no answer came (connection refused or reset, or the bound ran out). */
  readonly status: number | null
  /** The answer's JSON body (its text when it is not JSON), or the error's text when no answer came. */
  readonly response: unknown
  /** The `retry-after` header of the answer, if any. */
  readonly retryAfter: string | null
  /** Epoch ms when the request was sent and when its answer (or failure) arrived. */
  readonly startMs: number
  readonly endMs: number
}

/** Whether the operation was acknowledged (a 2xx answer). */
export const acknowledged = (op: Op): boolean => op.status !== null && op.status >= 200 && op.status < 300

/** Whether the operation failed in a way that may or may not have taken effect (5xx, or no answer). */
export const indeterminate = (op: Op): boolean => op.status === null || op.status >= 500

/** Makes requests over HTTP and records each one. */
export class Recorder {
  readonly ops: Op[] = []
  constructor(
    /** The coordinator's base URL; `setUrl` changes it (a restarted coordinator listens elsewhere). */
    private url: string,
    private readonly token: string,
    /** How long a request may take before it counts as unanswered (ms). */
    readonly boundMs = 20_000,
  ) {}

  setUrl(url: string): void {
    this.url = url
  }

  /** Sends one request and records it; never throws. */
  async call(kind: OpKind, id: string | null, method: string, path: string, body?: unknown): Promise<Op> {
    const startMs = Date.now()
    let status: number | null = null
    let response: unknown
    let retryAfter: string | null = null
    try {
      const res = await fetch(`${this.url}${path}`, {
        method,
        headers: {
          authorization: `Bearer ${this.token}`,
          ...(body === undefined ? {} : { "content-type": "application/json" }),
        },
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
        signal: AbortSignal.timeout(this.boundMs),
      })
      const text = await res.text()
      status = res.status
      retryAfter = res.headers.get("retry-after")
      try {
        response = text === "" ? null : JSON.parse(text)
      } catch {
        response = text
      }
    } catch (error) {
      response = error instanceof Error ? `${error.name}: ${error.message}` : String(error)
    }
    const op: Op = { kind, id, method, path, body, status, response, retryAfter, startMs, endMs: Date.now() }
    this.ops.push(op)
    return op
  }

  /** `POST /v1/sessions` with the session's id. */
  create(id: string, memMib: number, vcpus = 1): Promise<Op> {
    return this.call("create", id, "POST", "/v1/sessions", { id, memMib, vcpus })
  }

  /** `DELETE /v1/sessions/{id}`. */
  end(id: string): Promise<Op> {
    return this.call("end", id, "DELETE", `/v1/sessions/${encodeURIComponent(id)}`)
  }
}

/**
 * What the agents and the coordinator said about guests, for the rule that no guest an agent
 * reported running is destroyed without an explicit end or abort: an agent's report of a guest it
 * runs, the guest gone from that agent's report, a session's end and a move's outcome. `atMs` is
 * when it was seen (a report: when the read was sent; a destroy: when the read that lacks the
 * guest answered) or, for an end or a move's outcome, when it was asked for or recorded.
 */
export type GuestEvent =
  | { readonly kind: "guest_running"; readonly hostId: string; readonly sessionId: string; readonly atMs: number }
  | { readonly kind: "guest_destroyed"; readonly hostId: string; readonly sessionId: string; readonly atMs: number }
  | { readonly kind: "session_ended"; readonly sessionId: string; readonly atMs: number }
  | {
      readonly kind: "move_committed" | "move_aborted"
      readonly moveId: string
      readonly sessionId: string
      readonly sourceHostId: string
      readonly targetHostId: string
      readonly atMs: number
    }

/** The guest events of a run, in the order they were recorded. */
export class GuestLog {
  readonly events: GuestEvent[] = []
  record(event: GuestEvent): void {
    this.events.push(event)
  }
}
