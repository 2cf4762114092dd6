// @ts-check
// The engram dashboard. Everything it shows comes from the coordinator's API, read with the
// admin token the user signed in with (kept in sessionStorage: gone when the tab closes). Three
// views, chosen by the address's hash: the fleet (`#/`), the sessions (`#/sessions?state=…`)
// and one session (`#/sessions/<id>`). The shown view is read again when `/ui/changes` (a
// long-poll) says the fleet changed, after an action, and at least every 10 s. Every value
// reaches the page through textContent: nothing the API answers is parsed as HTML.
import { ApiError, TOKEN_KEY, api, token } from "./api.js"
import { el, notice } from "./dom.js"
import * as Fleet from "./fleet.js"
import { mib } from "./format.js"
import * as Session from "./session.js"
import * as Sessions from "./sessions.js"

const WAIT_MS = 10_000

/** @param {any} fleet */
const signalText = (fleet) => {
  const parts = [
    `${fleet.hosts.ready}/${fleet.hosts.total} hosts ready`,
    `RAM ${mib(fleet.freeMib)} free of ${mib(fleet.capacityMib)}`,
    `vCPUs ${fleet.freeVcpus} free of ${fleet.cpuBudget}`,
    `queue ${fleet.queue.sessions} (${fleet.queue.withoutRoom} without room)`,
  ]
  if (fleet.unplaceable && fleet.unplaceable.count > 0) parts.push(`${fleet.unplaceable.count} too big for any host`)
  parts.push(`${fleet.parks} parks`, `${fleet.descentsRunning} descents`)
  return parts.join(" · ")
}

// ---- views ------------------------------------------------------------------------------------

/**
 * The view the hash names.
 * @returns {{ view: "fleet" } | { view: "sessions", filters: ReturnType<typeof Sessions.filtersOf> } | { view: "session", id: string }}
 */
const route = () => {
  const hash = location.hash.replace(/^#/, "")
  const [path = "", query = ""] = hash.split("?")
  const one = /^\/sessions\/(.+)$/.exec(path)
  if (one !== null) return { view: "session", id: decodeURIComponent(one[1] ?? "") }
  if (path === "/sessions") return { view: "sessions", filters: Sessions.filtersOf(new URLSearchParams(query)) }
  return { view: "fleet" }
}

/** Shows one view's section and marks its tab. @param {string} view */
const show = (view) => {
  for (const v of ["fleet", "sessions", "session"]) el(`view-${v}`).hidden = v !== view
  for (const a of document.querySelectorAll("nav a")) {
    const current = a.getAttribute("data-view") === (view === "session" ? "sessions" : view)
    if (current) a.setAttribute("aria-current", "page")
    else a.removeAttribute("aria-current")
  }
}

let loading = Promise.resolve()

/** Reads the shown view again and draws it; calls made meanwhile wait for it. */
const refresh = () => {
  // A failed read is reported by its caller; the next one runs all the same.
  loading = loading.catch(() => undefined).then(async () => {
    const r = route()
    show(r.view)
    const fleet = await api("/v1/fleet")
    el("signal").textContent = signalText(fleet)
    if (r.view === "fleet") Fleet.render(await Fleet.load(fleet), changed)
    else if (r.view === "sessions") Sessions.render(await Sessions.load(r.filters))
    else Session.render(await Session.load(r.id), changed)
    el("updated").textContent = `updated ${new Date().toLocaleTimeString()}`
  })
  return loading
}

/** After an action: read the view again at once (and on the next change, as always). */
const changed = () => {
  void refresh().then(
    () => problem(null),
    (e) => problem(e),
  )
}

// ---- the loop ---------------------------------------------------------------------------------

let generation = 0

/** @param {number} ms */
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/** @param {unknown} e */
const problem = (e) => {
  const p = el("problem")
  p.hidden = e === null
  p.textContent = e === null ? "" : `Cannot read the fleet: ${e instanceof Error ? e.message : String(e)}`
}

/** The version of the fleet once it differs from `since` (or `waitMs` passed). @param {string} since @param {number} waitMs */
const changes = async (since, waitMs) => {
  const res = await fetch(`/ui/changes?since=${encodeURIComponent(since)}&waitMs=${waitMs}`, { headers: { authorization: `Bearer ${token()}` } })
  if (!res.ok) throw new ApiError(res.status, null)
  return String((await res.json()).version)
}

const run = async () => {
  const mine = ++generation
  /** @type {string | null} */
  let version = null
  while (mine === generation) {
    try {
      // The first call sets the baseline at once; then each waits until the fleet changes.
      version = await changes(version ?? "", version === null ? 0 : WAIT_MS)
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) return signOut("The coordinator refused the token.")
      // No long-poll (or it failed): refresh every 2 s.
      await sleep(2000)
    }
    if (mine !== generation) return
    try {
      await refresh()
      problem(null)
    } catch (e) {
      if (e instanceof ApiError && (e.status === 401 || e.status === 403)) {
        return signOut(e.status === 401 ? "The coordinator refused the token." : "This token cannot read the fleet: sign in with the admin token.")
      }
      problem(e)
    }
  }
}

/** @param {string} [message] */
const signOut = (message = "") => {
  generation++
  sessionStorage.removeItem(TOKEN_KEY)
  el("board").hidden = true
  el("sign-out").hidden = true
  el("sign-in").hidden = false
  el("signal").textContent = ""
  el("updated").textContent = ""
  el("sign-in-error").textContent = message
  el("token").focus()
}

const showBoard = () => {
  el("sign-in").hidden = true
  el("board").hidden = false
  el("sign-out").hidden = false
  void run()
}

el("sign-in-form").addEventListener("submit", async (event) => {
  event.preventDefault()
  const input = /** @type {HTMLInputElement} */ (el("token"))
  const typed = input.value.trim()
  el("sign-in-error").textContent = ""
  try {
    await api("/v1/fleet", { token: typed })
  } catch (e) {
    el("sign-in-error").textContent =
      e instanceof ApiError && e.status === 401
        ? "The coordinator refused this token."
        : e instanceof ApiError && e.status === 403
          ? "This is a host's token: the dashboard needs the admin token."
          : `Cannot reach the coordinator: ${e instanceof Error ? e.message : String(e)}`
    return
  }
  sessionStorage.setItem(TOKEN_KEY, typed)
  input.value = ""
  showBoard()
})
el("sign-out").addEventListener("click", () => signOut())
window.addEventListener("hashchange", () => {
  notice("")
  if (!el("board").hidden) changed()
})

if (token() !== "") showBoard()
else signOut()
