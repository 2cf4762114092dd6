// @ts-check
// The fleet view: the signal over time, every host as a card with a RAM bar and a vCPU bar
// (reserved, parked, free), the templates it holds and its actions (cordon, uncordon, drain), the queue with each
// session's reasons, parks, descents running, and the latest moves.
import { ApiError, api, describe, isMissingRoute, listAll } from "./api.js"
import { charts } from "./charts.js"
import { button, el, h, notice, sessionLink, table } from "./dom.js"
import { age, budget, committedBy, count, duration, mib, summarize, verdict } from "./format.js"

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

/** The fleet's history, or null from a coordinator that keeps none. */
const loadHistory = async () => {
  try {
    return await api("/ui/history")
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) return null
    throw e
  }
}

/** Everything the fleet view shows. @param {any} fleet */
export const load = async (fleet) => {
  const [hosts, queued, parks, descents, history] = await Promise.all([
    listAll("/v1/hosts"),
    listAll("/v1/sessions?state=queued"),
    listAll("/v1/sessions?state=parked"),
    listAll("/v1/sessions?state=descending"),
    loadHistory(),
  ])
  const [queue, moves] = await Promise.all([queueReasons(queued), loadMoves(hosts)])
  return { fleet, hosts, queue, parks, descents, moves, history }
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

/** What each host action does, in the words the page says after it. */
const hostActions = {
  cordon: { label: "Cordon", said: "cordoned: it takes no new sessions; what runs there stays" },
  uncordon: { label: "Uncordon", said: "is ready: it takes sessions again" },
  drain: { label: "Drain", said: "is draining: it takes no new sessions" },
}

/** The actions a host in this state offers. @param {string} state @returns {("cordon" | "uncordon" | "drain")[]} */
const actionsFor = (state) => (state === "ready" ? ["cordon", "drain"] : state === "cordoned" ? ["uncordon", "drain"] : ["uncordon"])

/**
 * The templates a host reported holding (sessions that name one prefer its holders), or null
 * from a coordinator older than templates.
 * @param {any} host
 */
const templatesText = (host) => {
  /** @type {{ name: string, memMib: number, vcpus: number }[] | undefined} */
  const held = host.report?.templates
  if (held === undefined) return host.report === null ? "Templates: not reported yet" : null
  return held.length === 0 ? "Templates: none" : `Templates: ${held.map((t) => `${t.name} (${budget(t)})`).join(" · ")}`
}

/** @param {any} host @param {number} parkedMib @param {number} parkedVcpus @param {() => void} changed */
const hostCard = (host, parkedMib, parkedVcpus, changed) => {
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
  const tpl = templatesText(host)
  const total = capacity ?? Math.max(reserved, 1)
  const cpuTotal = host.cpuBudget ?? Math.max(host.reservedVcpus, 1)
  const actions = h(
    "div",
    { className: "actions" },
    actionsFor(host.state).map((a) => {
      const b = button(a, hostActions[a].label)
      b.addEventListener("click", async () => {
        b.setAttribute("disabled", "")
        try {
          await api(`/v1/hosts/${encodeURIComponent(host.id)}/${a}`, { method: "POST", body: {} })
          notice(`${host.id} ${hostActions[a].said}`)
        } catch (e) {
          notice(`${hostActions[a].label} ${host.id}: ${describe(e)}`, true)
        }
        changed()
      })
      return b
    }),
  )
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
    h("p", { className: "muted", text: `${count(host.entries, "reservation")} · ${count(host.parks, "park")} · ${count(host.descentsRunning, "descent")}` }),
    ...(tpl === null ? [] : [h("p", { className: "figures templates", text: tpl })]),
    actions,
  ])
}

/** @param {Awaited<ReturnType<typeof load>>} d @param {() => void} changed */
export const render = (d, changed) => {
  el("charts").replaceChildren(...charts(d.history))
  /** @type {Map<string, { mem: number, vcpus: number }>} */
  const parked = new Map()
  for (const s of d.parks) {
    const p = parked.get(s.hostId) ?? { mem: 0, vcpus: 0 }
    parked.set(s.hostId, { mem: p.mem + s.budget.memMib, vcpus: p.vcpus + s.budget.vcpus })
  }
  el("hosts").replaceChildren(
    ...(d.hosts.length === 0
      ? [h("p", { className: "muted empty", text: "No hosts registered." })]
      : d.hosts.map((x) => hostCard(x, parked.get(x.id)?.mem ?? 0, parked.get(x.id)?.vcpus ?? 0, changed))),
  )
  el("queue").replaceChildren(
    table(
      ["#", "Session", "Needs", "Waiting", "Why"],
      d.queue.map((s, i) => [
        String(s.position ?? i + 1),
        sessionLink(s.id),
        budget(s.budget),
        age(s.queuedAt),
        `${summarize(s.reasons ?? [])}${s.tooBig ? " (too big for any host)" : ""}`,
      ]),
      "Nothing waits.",
    ),
  )
  el("parks").replaceChildren(table(["Session", "Host", "RAM", "Parked for"], d.parks.map((s) => [sessionLink(s.id), s.hostId ?? "-", mib(s.budget.memMib), age(s.parkedAt)]), "No parks."))
  el("descents").replaceChildren(
    table(["Session", "Host", "RAM", "For"], d.descents.map((s) => [sessionLink(s.id), s.hostId ?? "-", mib(s.budget.memMib), age(s.updatedAt)]), "No descents running."),
  )
  el("moves").replaceChildren(
    table(
      ["Session", "From → to", "Budget", "State", "By", "Phases or verdict"],
      d.moves.map((m) => [sessionLink(m.sessionId), `${m.sourceHostId} → ${m.targetHostId}`, duration(m.maxDowntimeMs), m.state, committedBy(m), verdict(m)]),
      "No moves yet.",
    ),
  )
}
