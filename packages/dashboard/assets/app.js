// @ts-check
// The engram dashboard. Everything it shows comes from the coordinator's API, read with the
// admin token the user signed in with (kept in sessionStorage: gone when the tab closes). It
// refetches when `/ui/changes` (a long-poll) says the fleet changed, and at least every 10 s.
// Every value reaches the page through textContent: nothing the API answers is parsed as HTML.

const TOKEN_KEY = "engram-token"
const WAIT_MS = 10_000

/** @param {string} id */
const el = (id) => /** @type {HTMLElement} */ (document.getElementById(id))

/**
 * @param {string} tag
 * @param {{ className?: string, text?: string, title?: string, attrs?: Record<string, string> }} [o]
 * @param {(Node | string)[]} [children]
 */
const h = (tag, o = {}, children = []) => {
  const node = document.createElement(tag)
  if (o.className) node.className = o.className
  if (o.text !== undefined) node.textContent = o.text
  if (o.title) node.title = o.title
  for (const [k, v] of Object.entries(o.attrs ?? {})) node.setAttribute(k, v)
  for (const c of children) node.append(c)
  return node
}

// ---- figures ----------------------------------------------------------------------------------

/** @param {number | null | undefined} n */
const mib = (n) => {
  if (n === null || n === undefined || !Number.isFinite(n)) return "-"
  const trim = (/** @type {number} */ x) => (Number.isInteger(x) ? String(x) : x.toFixed(1).replace(/\.0$/, ""))
  const a = Math.abs(n)
  if (a >= 1024 * 1024) return `${trim(n / (1024 * 1024))} TiB`
  if (a >= 1024) return `${trim(n / 1024)} GiB`
  return `${trim(n)} MiB`
}

/** @param {number} ms */
const duration = (ms) => {
  if (!Number.isFinite(ms) || ms < 0) return "-"
  if (ms < 1000) return `${Math.round(ms)} ms`
  const s = Math.floor(ms / 1000)
  if (s < 60) return `${s}s`
  const m = Math.floor(s / 60)
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`
  const hr = Math.floor(m / 60)
  if (hr < 48) return `${hr}h ${String(m % 60).padStart(2, "0")}m`
  return `${Math.floor(hr / 24)}d ${hr % 24}h`
}

/** @param {number | null | undefined} at */
const age = (at) => (at === null || at === undefined ? "-" : duration(Date.now() - at))

/** @param {{ reason: string }[]} noFit */
const summarize = (noFit) => {
  /** @type {Map<string, number>} */
  const counts = new Map()
  for (const d of noFit) counts.set(d.reason, (counts.get(d.reason) ?? 0) + 1)
  const room = counts.get("fits_now") ?? 0
  counts.delete("fits_now")
  const parts = [...counts.entries()].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0])).map(([r, n]) => `${n} ${r}`)
  const head = `${room}/${noFit.length} host${noFit.length === 1 ? "" : "s"} ${room === 1 && noFit.length === 1 ? "has" : "have"} room`
  return parts.length === 0 ? head : `${head}: ${parts.join(", ")}`
}

// ---- the API ----------------------------------------------------------------------------------

class ApiError extends Error {
  /** @param {number} status @param {any} body */
  constructor(status, body) {
    super(typeof body?.message === "string" ? body.message : `HTTP ${status}`)
    this.status = status
    this.body = body
  }
}

/** @param {string} path @param {string} [token] */
const api = async (path, token = sessionStorage.getItem(TOKEN_KEY) ?? "") => {
  const res = await fetch(path, { headers: { authorization: `Bearer ${token}`, accept: "application/json" } })
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

/** Every item of a list: `{items, nextCursor}` pages followed, or a plain array. @param {string} path */
const listAll = async (path) => {
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
const isMissingRoute = (e) => e instanceof ApiError && e.status === 404 && e.body?.entity === "route"

// ---- moves: listed by the API, or (older coordinators) found in the hosts' assignments ----------

/** @type {Map<string, any>} moves this page has seen, by id */
const seenMoves = new Map()

/** @param {any[]} hosts */
const loadMoves = async (hosts) => {
  try {
    const moves = await listAll("/v1/moves?limit=50")
    return moves.sort((a, b) => b.createdAt - a.createdAt).slice(0, 20)
  } catch (e) {
    if (!isMissingRoute(e)) throw e
  }
  // No move list: the pending moves are in the hosts' assignments; a move seen pending is read
  // again by id until it ends, so its verdict shows.
  const pending = new Set()
  const answers = await Promise.all(hosts.map((x) => api(`/v1/hosts/${encodeURIComponent(x.id)}/assignments`).catch(() => null)))
  for (const a of answers) for (const m of a?.moves ?? []) if (m.state === "pending") pending.add(m.id)
  for (const id of pending) seenMoves.set(id, { ...(seenMoves.get(id) ?? {}), id, state: "pending" })
  await Promise.all(
    [...seenMoves.values()]
      .filter((m) => m.state === "pending" || m.rounds === undefined)
      .map(async (m) => {
        const fresh = await api(`/v1/moves/${encodeURIComponent(m.id)}`).catch(() => null)
        if (fresh !== null) seenMoves.set(m.id, fresh)
      }),
  )
  return [...seenMoves.values()].filter((m) => m.rounds !== undefined).sort((a, b) => b.createdAt - a.createdAt).slice(0, 20)
}

// ---- the queue's reasons: the session's own `queue`, or a no-fit question per budget ------------

/** @param {any[]} queued */
const queueReasons = async (queued) => {
  /** @type {Map<string, Promise<any>>} */
  const byBudget = new Map()
  return Promise.all(
    queued.slice(0, 25).map(async (s) => {
      const one = await api(`/v1/sessions/${encodeURIComponent(s.id)}`).catch(() => s)
      if (one.queue) return { ...one, reasons: one.queue.noFit, tooBig: one.queue.tooBig, position: one.queue.position }
      const key = `${s.budget.memMib}/${s.budget.vcpus}`
      if (!byBudget.has(key)) byBudget.set(key, api(`/v1/placement/no-fit?memMib=${s.budget.memMib}&vcpus=${s.budget.vcpus}`).catch(() => ({ hosts: [] })))
      const nf = await byBudget.get(key)
      return { ...s, reasons: nf.hosts, tooBig: false, position: null }
    }),
  )
}

// ---- rendering --------------------------------------------------------------------------------

/**
 * A bar of segments over a total.
 * @param {string} label
 * @param {{ className: string, value: number }[]} segments
 * @param {number} total
 */
const bar = (label, segments, total) => {
  const node = h("div", { className: "bar", attrs: { role: "img", "aria-label": label } })
  for (const s of segments) {
    const seg = h("span", { className: `seg ${s.className}` })
    seg.style.width = `${total > 0 ? Math.max(0, Math.min(100, (s.value / total) * 100)) : 0}%`
    node.append(seg)
  }
  return node
}

/** @param {any} host @param {number} parkedMib @param {number} parkedVcpus */
const hostCard = (host, parkedMib, parkedVcpus) => {
  const capacity = host.allocatableMib
  const reserved = host.reservedMib
  const freeMib = capacity === null ? null : capacity - reserved
  const ramText =
    capacity === null
      ? `RAM ${mib(reserved)} reserved (not measured yet)`
      : `RAM ${mib(reserved - parkedMib)} reserved · ${mib(parkedMib)} parked · ${mib(Math.max(0, freeMib ?? 0))} free of ${mib(capacity)}${(freeMib ?? 0) < 0 ? ` (over by ${mib(-(freeMib ?? 0))})` : ""}`
  const cpuText =
    host.cpuBudget === null
      ? `vCPUs ${host.reservedVcpus} reserved (not measured yet)`
      : `vCPUs ${host.reservedVcpus - parkedVcpus} reserved · ${parkedVcpus} parked · ${Math.max(0, host.cpuBudget - host.reservedVcpus)} free of ${host.cpuBudget}`
  const total = capacity ?? Math.max(reserved, 1)
  const cpuTotal = host.cpuBudget ?? Math.max(host.reservedVcpus, 1)
  return h("article", { className: `host state-${host.state}`, attrs: { "data-host": host.id } }, [
    h("header", {}, [h("h3", { text: host.id }), h("span", { className: `badge state-${host.state}`, text: host.state })]),
    bar(
      ramText,
      [
        { className: "running", value: Math.max(0, reserved - parkedMib) },
        { className: "parked", value: parkedMib },
        { className: "free", value: Math.max(0, total - reserved) },
      ],
      Math.max(total, reserved),
    ),
    h("p", { className: "figures ram", text: ramText }),
    bar(
      cpuText,
      [
        { className: "running", value: Math.max(0, host.reservedVcpus - parkedVcpus) },
        { className: "parked", value: parkedVcpus },
        { className: "free", value: Math.max(0, cpuTotal - host.reservedVcpus) },
      ],
      Math.max(cpuTotal, host.reservedVcpus),
    ),
    h("p", { className: "figures cpu", text: cpuText }),
    h("p", { className: "muted", text: `${host.entries} reservations · ${host.parks} parks · ${host.descentsRunning} descents` }),
  ])
}

/** @param {string[]} headers @param {string[][]} rows @param {string} empty */
const table = (headers, rows, empty) => {
  if (rows.length === 0) return h("p", { className: "muted empty", text: empty })
  return h("table", {}, [
    h("thead", {}, [h("tr", {}, headers.map((x) => h("th", { text: x })))]),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => h("td", { text: c }))))),
  ])
}

/** @param {any} m */
const verdict = (m) => {
  if (m.state === "committed" && m.phases) {
    const p = m.phases
    return `committed: paused ${duration(p.downtimeMs)} (capture ${duration(p.captureMs)} · send ${duration(p.sendMs)} · commit ${duration(p.commitMs)})`
  }
  if (m.state === "aborted") {
    if (typeof m.abortEstimateMs === "number") return `refused: estimate ${duration(m.abortEstimateMs)} > budget ${duration(m.maxDowntimeMs)}`
    return `aborted: ${m.abortReason ?? "no reason given"}`
  }
  const rounds = m.rounds ?? []
  const last = rounds.at(-1)
  return rounds.length === 0 ? "starting" : `in progress: ${rounds.length} round${rounds.length === 1 ? "" : "s"}, last ${last.kind}`
}

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

/** @param {{ fleet: any, hosts: any[], queue: any[], parks: any[], descents: any[], moves: any[] }} d */
const render = (d) => {
  el("signal").textContent = signalText(d.fleet)
  el("updated").textContent = `updated ${new Date().toLocaleTimeString()}`
  /** @type {Map<string, { mem: number, vcpus: number }>} */
  const parked = new Map()
  for (const s of d.parks) {
    const p = parked.get(s.hostId) ?? { mem: 0, vcpus: 0 }
    parked.set(s.hostId, { mem: p.mem + s.budget.memMib, vcpus: p.vcpus + s.budget.vcpus })
  }
  el("hosts").replaceChildren(
    ...(d.hosts.length === 0 ? [h("p", { className: "muted empty", text: "No hosts registered." })] : d.hosts.map((x) => hostCard(x, parked.get(x.id)?.mem ?? 0, parked.get(x.id)?.vcpus ?? 0))),
  )
  el("queue").replaceChildren(
    table(
      ["#", "Session", "Needs", "Waiting", "Why"],
      d.queue.map((s, i) => [
        String(s.position ?? i + 1),
        s.id,
        `${mib(s.budget.memMib)}, ${s.budget.vcpus} vCPU${s.budget.vcpus === 1 ? "" : "s"}`,
        age(s.queuedAt),
        `${summarize(s.reasons ?? [])}${s.tooBig ? " (too big for any host)" : ""}`,
      ]),
      "Nothing waits.",
    ),
  )
  el("parks").replaceChildren(table(["Session", "Host", "RAM", "Parked for"], d.parks.map((s) => [s.id, s.hostId ?? "-", mib(s.budget.memMib), age(s.parkedAt)]), "No parks."))
  el("descents").replaceChildren(
    table(["Session", "Host", "RAM", "For"], d.descents.map((s) => [s.id, s.hostId ?? "-", mib(s.budget.memMib), age(s.updatedAt)]), "No descents running."),
  )
  el("moves").replaceChildren(
    table(
      ["Session", "From → to", "Budget", "State", "Phases or verdict"],
      d.moves.map((m) => [m.sessionId, `${m.sourceHostId} → ${m.targetHostId}`, duration(m.maxDowntimeMs), m.state, verdict(m)]),
      "No moves yet.",
    ),
  )
}

// ---- the loop ---------------------------------------------------------------------------------

let generation = 0

const load = async () => {
  const [fleet, hosts, queued, parks, descents] = await Promise.all([
    api("/v1/fleet"),
    listAll("/v1/hosts"),
    listAll("/v1/sessions?state=queued"),
    listAll("/v1/sessions?state=parked"),
    listAll("/v1/sessions?state=descending"),
  ])
  const [queue, moves] = await Promise.all([queueReasons(queued), loadMoves(hosts)])
  render({ fleet, hosts, queue, parks, descents, moves })
}

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
  const token = sessionStorage.getItem(TOKEN_KEY) ?? ""
  const res = await fetch(`/ui/changes?since=${encodeURIComponent(since)}&waitMs=${waitMs}`, { headers: { authorization: `Bearer ${token}` } })
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
      await load()
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
  const token = input.value.trim()
  el("sign-in-error").textContent = ""
  try {
    await api("/v1/fleet", token)
  } catch (e) {
    el("sign-in-error").textContent =
      e instanceof ApiError && e.status === 401
        ? "The coordinator refused this token."
        : e instanceof ApiError && e.status === 403
          ? "This is a host's token: the dashboard needs the admin token."
          : `Cannot reach the coordinator: ${e instanceof Error ? e.message : String(e)}`
    return
  }
  sessionStorage.setItem(TOKEN_KEY, token)
  input.value = ""
  showBoard()
})
el("sign-out").addEventListener("click", () => signOut())

if (sessionStorage.getItem(TOKEN_KEY)) showBoard()
else signOut()
