/* eslint-disable @typescript-eslint/no-explicit-any -- test bodies are read loosely; each assertion states the shape it expects */
// A tiny JSON client over real HTTP for the end-to-end tests.
import { vi } from "vitest"
export interface Answer<T = any> {
  readonly status: number
  readonly body: T
  readonly headers: Headers
}

export const call = async <T = any>(
  base: string,
  method: string,
  path: string,
  options: { readonly token?: string | undefined; readonly body?: unknown; readonly raw?: string; readonly signal?: AbortSignal } = {},
): Promise<Answer<T>> => {
  const headers: Record<string, string> = {}
  if (options.token !== undefined) headers["authorization"] = `Bearer ${options.token}`
  let body: string | undefined
  if (options.raw !== undefined) {
    body = options.raw
    headers["content-type"] = "application/json"
  } else if (options.body !== undefined) {
    body = JSON.stringify(options.body)
    headers["content-type"] = "application/json"
  }
  const res = await fetch(`${base}${path}`, { method, headers, ...(body === undefined ? {} : { body }), ...(options.signal === undefined ? {} : { signal: options.signal }) })
  const text = await res.text()
  let parsed: unknown = text
  try {
    parsed = text === "" ? null : JSON.parse(text)
  } catch {
    // text bodies (metrics) stay text
  }
  return { status: res.status, body: parsed as T, headers: res.headers }
}

/** A client bound to a base URL and a token. */
export const client = (base: string, token?: string) => ({
  get: <T = any>(path: string) => call<T>(base, "GET", path, { token }),
  post: <T = any>(path: string, body?: unknown) => call<T>(base, "POST", path, { token, body: body ?? {} }),
  put: <T = any>(path: string, body?: unknown) => call<T>(base, "PUT", path, { token, body }),
  del: <T = any>(path: string) => call<T>(base, "DELETE", path, { token }),
  raw: (method: string, path: string, raw: string) => call(base, method, path, { token, raw }),
})

export type Client = ReturnType<typeof client>

let counter = 0
/** A unique id for a test's hosts and sessions (the suites share one coordinator). */
export const uid = (prefix: string): string => `${prefix}-${Date.now().toString(36)}-${(counter++).toString(36)}`

/** Every item of a paged list (`{items, nextCursor}`), following the cursors 1000 at a time. */
export const listAll = async <T = any>(c: Client, path: string): Promise<T[]> => {
  const items: T[] = []
  let cursor: string | null = null
  for (;;) {
    const sep = path.includes("?") ? "&" : "?"
    const page: Answer<{ items: T[]; nextCursor: string | null }> = await c.get(`${path}${sep}limit=1000${cursor === null ? "" : `&cursor=${encodeURIComponent(cursor)}`}`)
    if (page.status !== 200) throw new Error(`GET ${path}: ${page.status} ${JSON.stringify(page.body)}`)
    items.push(...page.body.items)
    cursor = page.body.nextCursor
    if (cursor === null) return items
  }
}

/** The pending move of a session, as its source host's assignments show it (long-polled until it appears). */
export const pendingMove = async (api: Client, sourceHostId: string, sessionId: string): Promise<string> => {
  for (;;) {
    const a = await api.get(`/v1/hosts/${sourceHostId}/assignments?waitMs=2000`)
    const m = (a.body.moves as { id: string; sessionId: string; state: string }[]).find((x) => x.sessionId === sessionId && x.state === "pending")
    if (m !== undefined) return m.id
  }
}

/** Runs `f` with the coordinator's log lines (stdout) captured. */
export const logged = async <A>(f: () => Promise<A>): Promise<{ result: A; lines: string }> => {
  let lines = ""
  const spy = vi.spyOn(process.stdout, "write").mockImplementation((chunk: string | Uint8Array) => {
    lines += typeof chunk === "string" ? chunk : Buffer.from(chunk).toString()
    return true
  })
  try {
    return { result: await f(), lines }
  } finally {
    spy.mockRestore()
  }
}
