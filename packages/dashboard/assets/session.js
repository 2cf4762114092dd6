// @ts-check
// One session's page: what it is (state, host, budget, the template it starts from, queue position and reasons), its
// actions (park, resume, move within a downtime budget, end), its latest move with its rounds
// and phases or verdict, and its history, oldest first.
import { ApiError, api, describe, listAll } from "./api.js"
import { badge, button, el, h, notice, table } from "./dom.js"
import { age, budget, bytes, clock, committedByLine, duration, measured, signed, since, summarize, verdict } from "./format.js"

/** The session, its events, its latest move and the hosts a move may go to. @param {string} id */
export const load = async (id) => {
  let session
  try {
    session = await api(`/v1/sessions/${encodeURIComponent(id)}`)
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) return { id, session: null, events: [], move: null, allowance: null, hosts: [] }
    throw e
  }
  const [events, hosts] = await Promise.all([listAll(`/v1/sessions/${encodeURIComponent(id)}/events?limit=500`), listAll("/v1/hosts")])
  const begun = events.filter((e) => e.kind === "move_begun").at(-1)
  const move = begun === undefined ? null : await api(`/v1/moves/${encodeURIComponent(begun.moveId)}`).catch(() => null)
  // The commit allowance of the move's host pair as the coordinator knows it now (the one a
  // committed move used is on the move itself, `guard`); from an older coordinator, its prior.
  const allowance =
    move === null
      ? null
      : await api(`/v1/hosts/${encodeURIComponent(move.sourceHostId)}/allowances?targetHostId=${encodeURIComponent(move.targetHostId)}`).then(
          (a) => {
            const pair = (a?.items ?? []).find((/** @type {any} */ x) => x.targetHostId === move.targetHostId)
            return pair === undefined ? { ms: a.priorMs, source: "prior", samples: 0 } : { ms: pair.allowanceMs, source: pair.source, samples: pair.samples }
          },
          () =>
            api(`/v1/hosts/${encodeURIComponent(move.sourceHostId)}/assignments?waitMs=0`).then(
              (a) => (typeof a?.limits?.commitAllowanceMs === "number" ? { ms: a.limits.commitAllowanceMs, source: "prior", samples: 0 } : null),
              () => null,
            ),
        )
  return { id, session, events, move, allowance, hosts: hosts.filter((x) => x.state === "ready").map((x) => x.id) }
}

/** A move asked for from this page, until its answer comes (the call waits for the outcome). @type {Map<string, string>} */
const moving = new Map()

/** The key-value facts of the session. @param {any} s */
const facts = (s) => {
  /** @type {[string, string | Node][]} */
  const rows = [
    ["State", h("span", {}, [badge(s.state), ` for ${age(since(s))}`])],
    ["Host", s.hostId ?? "-"],
    ["Budget", budget(s.budget)],
    // Absent from a coordinator older than templates.
    ...(/** @type {[string, string][]} */ (s.template === undefined ? [] : [["Template", s.template ?? "none (boots)"]])),
    ["Affinity", s.affinity.length === 0 ? "-" : s.affinity.join(", ")],
    ["Reservation", s.reservationId ?? "-"],
    ["Created", `${clock(s.createdAt)} (${age(s.createdAt)} ago)`],
  ]
  if (s.queue) rows.push(["Queue", `position ${s.queue.position}; ${summarize(s.queue.noFit)}${s.queue.tooBig ? " (too big for any host: it waits for a bigger one)" : ""}`])
  return h(
    "dl",
    { className: "facts" },
    rows.flatMap(([k, v]) => [h("dt", { text: k }), typeof v === "string" ? h("dd", { text: v }) : h("dd", {}, [v])]),
  )
}

/** One action's call, said in the notice line, then a refresh. @param {string} what @param {() => Promise<string>} call @param {() => void} changed */
const act = async (what, call, changed) => {
  try {
    notice(await call())
  } catch (e) {
    notice(`${what}: ${describe(e)}`, true)
  }
  changed()
}

/** The actions the session's state allows. @param {any} s @param {string[]} hosts @param {() => void} changed */
const actions = (s, hosts, changed) => {
  const id = encodeURIComponent(s.id)
  /** @type {HTMLElement[]} */
  const out = []
  if (s.state === "running") {
    const park = button("idle", "Park", "the session goes idle: it parks (paused in RAM, resumes warm) while nothing waits for room, else it descends")
    park.addEventListener("click", () =>
      act("Park", async () => {
        const r = await api(`/v1/sessions/${id}/idle`, { method: "POST", body: {} })
        return r.state === "parked" ? `${s.id} parked: paused in RAM, resumes warm` : `${s.id} is ${r.state}: room was needed, so it is captured to storage`
      }, changed),
    )
    out.push(park)
  }
  if (s.state === "parked" || s.state === "descended") {
    const resume = button("resume", "Resume")
    resume.addEventListener("click", () =>
      act("Resume", async () => {
        const r = await api(`/v1/sessions/${id}/resume`, { method: "POST", body: {} })
        if (r.state === "queued") return `${s.id} queued at position ${r.position} to restore: ${summarize(r.noFit ?? [])}`
        return r.resumed === "warm" ? `${s.id} resumed warm on ${r.hostId}: unparked where it was` : `${s.id} restoring on ${r.hostId} from its descent image`
      }, changed),
    )
    out.push(resume)
  }
  if (s.state !== "ended") {
    const end = button("end", "End")
    const confirm = button("confirm-end", `Confirm: end ${s.id}`)
    const cancel = button("cancel-end", "Cancel")
    confirm.hidden = true
    cancel.hidden = true
    confirm.classList.add("danger")
    end.addEventListener("click", () => {
      end.hidden = true
      confirm.hidden = false
      cancel.hidden = false
      confirm.focus()
    })
    cancel.addEventListener("click", () => {
      end.hidden = false
      confirm.hidden = true
      cancel.hidden = true
    })
    confirm.addEventListener("click", () =>
      act("End", async () => {
        await api(`/v1/sessions/${id}`, { method: "DELETE" })
        return `${s.id} ended: its room is released`
      }, changed),
    )
    out.push(end, confirm, cancel)
  }
  const bar = h("div", { className: "actions" }, out)
  if (s.state !== "running" || moving.has(s.id)) {
    return moving.has(s.id) ? [bar, h("p", { className: "muted", text: moving.get(s.id) ?? "" })] : [bar]
  }
  // A live move within a downtime budget, to a chosen host or the best-ranked one that takes
  // moves (the coordinator picks only hosts whose agent advertises a peer URL for a move without a target).
  const maxDowntime = /** @type {HTMLInputElement} */ (h("input", { attrs: { id: "move-budget", type: "number", min: "1", step: "1", value: "600", required: "" } }))
  const target = /** @type {HTMLSelectElement} */ (
    h("select", { attrs: { id: "move-target" } }, [
      h("option", { text: "the best-ranked host that takes moves", title: "a host whose agent advertises a peer URL", attrs: { value: "" } }),
      ...hosts.filter((x) => x !== s.hostId).map((x) => h("option", { text: x, attrs: { value: x } })),
    ])
  )
  const form = h("form", { className: "move-form", attrs: { "aria-label": "Move live" } }, [
    h("div", { className: "field" }, [h("label", { text: "Downtime budget (ms)", attrs: { for: "move-budget" } }), maxDowntime]),
    h("div", { className: "field" }, [h("label", { text: "Move to", attrs: { for: "move-target" } }), target]),
    h("button", { text: "Move", attrs: { type: "submit" } }),
  ])
  form.addEventListener("submit", (e) => {
    e.preventDefault()
    const budgetMs = Number(maxDowntime.value)
    const to = target.value
    moving.set(s.id, `Moving ${s.id}${to === "" ? "" : ` to ${to}`} within ${duration(budgetMs)}: the guest keeps running while the pre-copy rounds go…`)
    changed()
    void act(
      "Move",
      async () => {
        try {
          const r = await api(`/v1/sessions/${id}/move`, { method: "POST", body: { maxDowntimeMs: budgetMs, ...(to === "" ? {} : { targetHostId: to }) } })
          return `${s.id} moved to ${r.move.targetHostId}: paused ${duration(r.downtimeMs)} (capture ${duration(r.captureMs)} · send ${duration(r.sendMs)} · commit ${duration(r.commitMs)}) within ${duration(budgetMs)}`
        } finally {
          moving.delete(s.id)
        }
      },
      changed,
    )
  })
  return [bar, h("h4", { text: "Move live to another host" }), form]
}

/**
 * Where a commit allowance came from (SPEC §13): the pair's own recent commits, pooled with its
 * target's or the fleet's when it has none (a pool counts from 5), or the prior.
 * @param {string} source @param {number} samples
 */
const allowanceSource = (source, samples) =>
  source === "learned"
    ? `learned from the last ${samples} commits of this host pair`
    : source === "target"
      ? `learned from ${samples} recent commits into this target: too few of this host pair`
      : source === "fleet"
        ? `learned from ${samples} recent commits of the fleet: too few of this host pair or into this target`
        : "the prior, ENGRAM_COMMIT_ALLOWANCE_MS: no recent commits of this host pair, too few into this target or anywhere"

/**
 * The session's latest move: where, its budget, its rounds and its phases or verdict, and the
 * commit allowance the guard counts for the pause after the final round.
 * @param {any} m @param {{ ms: number, source: string, samples: number } | null} allowance
 */
const moveView = (m, allowance) => {
  if (m === null) return [h("p", { className: "muted empty", text: "No move yet." })]
  const rounds = table(
    ["Round", "Kind", "Sent", "Dirty", "Send", "Capture"],
    (m.rounds ?? []).map((/** @type {any} */ r, /** @type {number} */ i) => [String(i + 1), r.kind, bytes(r.wireBytes), bytes(r.apparentBytes), measured(r.sendMs), r.captureMs === undefined || r.captureMs === null ? "-" : measured(r.captureMs)]),
    "No round yet.",
  )
  const g = m.guard ?? null
  const allowed =
    g !== null
      ? `${measured(g.allowanceMs)} (${allowanceSource(g.allowanceSource, g.allowanceSamples)}); off by ${signed(g.allowanceErrorMs)} against the commit`
      : allowance === null
        ? "not reported by this coordinator"
        : `${measured(allowance.ms)} now (${allowanceSource(allowance.source, allowance.samples)})`
  const guardFacts =
    g === null
      ? []
      : [h("dt", { text: "Guard estimate" }), h("dd", { className: "estimate", attrs: { id: "move-estimate" }, text: `${measured(g.estimateMs)}; off by ${signed(g.estimateErrorMs)} against the pause` })]
  return [
    h("dl", { className: "facts", attrs: { "data-move": m.id } }, [
      h("dt", { text: "Move" }),
      h("dd", { text: `${m.sourceHostId} → ${m.targetHostId}` }),
      h("dt", { text: "Budget" }),
      h("dd", { text: duration(m.maxDowntimeMs) }),
      h("dt", { text: "State" }),
      h("dd", {}, [badge(m.state)]),
      h("dt", { text: "Outcome" }),
      h("dd", { className: "verdict", text: verdict(m) }),
      h("dt", { text: "Committed by" }),
      h("dd", { className: "committed-by", attrs: { id: "move-committed-by" }, text: committedByLine(m) }),
      h("dt", { text: "Commit allowance" }),
      h("dd", { className: "allowance", attrs: { id: "move-allowance" }, text: allowed }),
      ...guardFacts,
    ]),
    rounds,
  ]
}

/** An event's figures beyond its kind and host, as `key=value`. @param {any} e */
const details = (e) =>
  Object.entries(e)
    .filter(([k]) => !["seq", "at", "kind", "hostId", "sessionId"].includes(k))
    .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`)
    .join(" ")

/** @param {Awaited<ReturnType<typeof load>>} d @param {() => void} changed */
export const render = (d, changed) => {
  const title = el("session-title")
  const s = d.session
  if (s === null) {
    title.replaceChildren(`Session ${d.id}`)
    el("session").replaceChildren(h("p", { className: "error", text: `No session ${d.id} on this coordinator.` }))
    return
  }
  title.replaceChildren(`Session ${s.id} `, badge(s.state))
  const view = el("session")
  if (view.dataset["session"] !== s.id || document.getElementById("session-actions") === null) {
    view.dataset["session"] = s.id
    view.replaceChildren(
      h("div", { attrs: { id: "session-facts" } }),
      h("h3", { text: "Actions" }),
      h("div", { attrs: { id: "session-actions" } }),
      h("h3", { text: "Latest move" }),
      h("div", { attrs: { id: "session-move" } }),
      h("h3", { text: "Events" }),
      h("div", { attrs: { id: "session-events" } }),
    )
  }
  el("session-facts").replaceChildren(facts(s))
  // The actions are built again only when what they offer changes, so a refresh keeps a budget
  // being typed or an end waiting for its confirmation.
  const actionsKey = `${s.state} ${s.hostId ?? ""} ${moving.get(s.id) ?? ""} ${d.hosts.join(",")}`
  const box = el("session-actions")
  if (box.dataset["key"] !== actionsKey) {
    box.dataset["key"] = actionsKey
    box.replaceChildren(...actions(s, d.hosts, changed))
  }
  el("session-move").replaceChildren(...moveView(d.move, d.allowance))
  el("session-events").replaceChildren(
    table(
      ["#", "When", "Event", "Host", "Details"],
      d.events.map((e) => [String(e.seq), clock(e.at), e.kind, e.hostId ?? "-", details(e)]),
      "No events.",
      "events",
    ),
  )
}
