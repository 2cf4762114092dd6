// @ts-check
// The sessions view: every session, a page at a time, filtered by state and host (the API's
// filters) and by a part of its id (on the loaded pages); each id opens the session's page.
import { api, listAll } from "./api.js"
import { badge, el, h, sessionLink, table } from "./dom.js"
import { age, budget, clock, since } from "./format.js"

/** The states a session can be in, in the order of its life. */
export const states = ["queued", "pending", "running", "parked", "descending", "descended", "moving", "ended", "lost"]

const PAGE = 100

/** The view's filters, from the page's hash (`#/sessions?state=parked&host=h1&q=web`). @param {URLSearchParams} params */
export const filtersOf = (params) => ({ state: params.get("state") ?? "", host: params.get("host") ?? "", q: params.get("q") ?? "", pages: Math.max(1, Number(params.get("pages") ?? "1") || 1) })

/** @param {{ state: string, host: string, q: string, pages: number }} f */
const hashOf = (f) => {
  const p = new URLSearchParams()
  if (f.state !== "") p.set("state", f.state)
  if (f.host !== "") p.set("host", f.host)
  if (f.q !== "") p.set("q", f.q)
  if (f.pages > 1) p.set("pages", String(f.pages))
  const q = p.toString()
  return `#/sessions${q === "" ? "" : `?${q}`}`
}

/** The sessions the filters select, `pages` pages of them, and the hosts to filter by. @param {ReturnType<typeof filtersOf>} f */
export const load = async (f) => {
  const query = new URLSearchParams({ limit: String(PAGE) })
  if (f.state !== "") query.set("state", f.state)
  if (f.host !== "") query.set("hostId", f.host)
  /** @type {any[]} */
  const sessions = []
  let cursor = null
  let more = false
  for (let i = 0; i < f.pages; i++) {
    if (cursor !== null) query.set("cursor", cursor)
    const page = await api(`/v1/sessions?${query}`)
    sessions.push(...page.items)
    cursor = page.nextCursor
    more = cursor !== null
    if (!more) break
  }
  const hosts = await listAll("/v1/hosts")
  return { filters: f, sessions, more, hosts: hosts.map((x) => x.id) }
}

/** @param {string} label @param {string} id @param {HTMLElement} control */
const field = (label, id, control) => {
  control.id = id
  return h("div", { className: "field" }, [h("label", { text: label, attrs: { for: id } }), control])
}

/** @param {string} value @param {string[]} options @param {string} all */
const select = (value, options, all) => {
  const s = /** @type {HTMLSelectElement} */ (h("select", {}, [h("option", { text: all, attrs: { value: "" } }), ...options.map((o) => h("option", { text: o, attrs: { value: o } }))]))
  s.value = value
  return s
}

/** The filters' form; built again only when the filters or the hosts change (a refresh keeps what is being typed). @param {Awaited<ReturnType<typeof load>>} d */
const filtersForm = (d) => {
  const f = d.filters
  const key = `${hashOf(f)} ${d.hosts.join(",")}`
  const existing = document.getElementById("sessions-filters")
  if (existing !== null && existing.dataset["key"] === key) return existing
  const state = select(f.state, states, "every state")
  const host = select(f.host, d.hosts, "every host")
  const q = /** @type {HTMLInputElement} */ (h("input", { attrs: { type: "search", placeholder: "part of an id", value: f.q, spellcheck: "false" } }))
  // The filters as the controls show them now (two changes in a row both count).
  const go = () => {
    location.hash = hashOf({ state: state.value, host: host.value, q: q.value.trim(), pages: 1 })
  }
  state.addEventListener("change", go)
  host.addEventListener("change", go)
  q.addEventListener("change", go)
  const form = h("form", { className: "filters", attrs: { role: "search", id: "sessions-filters", "data-key": key } }, [
    field("State", "filter-state", state),
    field("Host", "filter-host", host),
    field("Id", "filter-id", q),
  ])
  form.addEventListener("submit", (e) => {
    e.preventDefault()
    go()
  })
  return form
}

/** @param {Awaited<ReturnType<typeof load>>} d */
export const render = (d) => {
  const f = d.filters
  const form = filtersForm(d)
  const shown = f.q === "" ? d.sessions : d.sessions.filter((s) => s.id.includes(f.q))
  const now = Date.now()
  const rows = shown.map((s) => [sessionLink(s.id), badge(s.state), s.hostId ?? "-", budget(s.budget), age(since(s) ?? now), clock(s.createdAt)])
  const count = h("p", { className: "muted count", text: `${shown.length} session${shown.length === 1 ? "" : "s"}${d.more ? " shown; more on the next page" : ""}${f.q === "" ? "" : ` with "${f.q}" in the id`}` })
  const results = [count, table(["Session", "State", "Host", "Needs", "In state for", "Created"], rows, "No sessions match.", "sessions")]
  if (d.more) {
    const next = h("button", { text: "Show more", attrs: { type: "button" } })
    next.addEventListener("click", () => {
      location.hash = hashOf({ ...f, pages: f.pages + 1 })
    })
    results.push(next)
  }
  const view = el("sessions")
  if (form.parentElement !== view) view.replaceChildren(form, h("div", { attrs: { id: "sessions-results" } }))
  el("sessions-results").replaceChildren(...results)
}
