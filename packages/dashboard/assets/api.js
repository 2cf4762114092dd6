// @ts-check
// The coordinator's API from the browser, with the admin token the user signed in with (kept in
// sessionStorage: gone when the tab closes). Errors carry the status and the JSON body.

export const TOKEN_KEY = "engram-token"

export const token = () => sessionStorage.getItem(TOKEN_KEY) ?? ""

export class ApiError extends Error {
  /** @param {number} status @param {any} body */
  constructor(status, body) {
    super(typeof body?.message === "string" ? body.message : typeof body?.error === "string" ? body.error : `HTTP ${status}`)
    this.status = status
    this.body = body
  }
}

/**
 * One call: GET unless told, a JSON body when given.
 * @param {string} path
 * @param {{ method?: string, body?: unknown, token?: string }} [o]
 */
export const api = async (path, o = {}) => {
  /** @type {Record<string, string>} */
  const headers = { authorization: `Bearer ${o.token ?? token()}`, accept: "application/json" }
  /** @type {RequestInit} */
  const init = { method: o.method ?? "GET", headers }
  if (o.body !== undefined) {
    headers["content-type"] = "application/json"
    init.body = JSON.stringify(o.body)
  }
  const res = await fetch(path, init)
  const text = await res.text()
  let body
  try {
    body = text === "" ? null : JSON.parse(text)
  } catch {
    body = { message: text.slice(0, 200) }
  }
  if (!res.ok) throw new ApiError(res.status, body)
  return body
}

/** Every item of a list: `{items, nextCursor}` pages followed (at most 100 pages). @param {string} path */
export const listAll = async (path) => {
  /** @type {any[]} */
  const out = []
  let cursor = null
  for (let i = 0; i < 100; i++) {
    const sep = path.includes("?") ? "&" : "?"
    const page = await api(cursor === null ? path : `${path}${sep}cursor=${encodeURIComponent(cursor)}`)
    if (Array.isArray(page)) return page
    out.push(...(page.items ?? []))
    if (page.nextCursor === null || page.nextCursor === undefined || page.nextCursor === cursor) break
    cursor = page.nextCursor
  }
  return out
}

/** @param {unknown} e */
export const isMissingRoute = (e) => e instanceof ApiError && e.status === 404 && e.body?.entity === "route"

/** An error as one line for the page. @param {unknown} e */
export const describe = (e) => {
  if (!(e instanceof ApiError)) return e instanceof Error ? e.message : String(e)
  const b = e.body ?? {}
  if (b.error === "ErrMoveDowntime" && typeof b.estimateMs === "number")
    return `refused before the guest paused: estimate ${Math.round(b.estimateMs)} ms > budget ${Math.round(b.maxDowntimeMs ?? 0)} ms; it keeps running on its host`
  if (typeof b.field === "string") return `${b.field}: ${b.rule ?? e.message}`
  if (typeof b.from === "string" && typeof b.to === "string") return `${e.message} (${b.from} → ${b.to})`
  return e.message
}
