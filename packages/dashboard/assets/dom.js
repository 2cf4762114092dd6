// @ts-check
// Building the page: elements from data with textContent only (nothing the API answers is
// parsed as HTML), tables, links inside the page, and one line of notice after an action.

/** @param {string} id */
export const el = (id) => /** @type {HTMLElement} */ (document.getElementById(id))

/**
 * @param {string} tag
 * @param {{ className?: string, text?: string, title?: string, attrs?: Record<string, string> }} [o]
 * @param {(Node | string)[]} [children]
 */
export const h = (tag, o = {}, children = []) => {
  const node = document.createElement(tag)
  if (o.className) node.className = o.className
  if (o.text !== undefined) node.textContent = o.text
  if (o.title) node.title = o.title
  for (const [k, v] of Object.entries(o.attrs ?? {})) node.setAttribute(k, v)
  for (const c of children) node.append(c)
  return node
}

/** A link to a view of this page (`#/sessions/<id>`). @param {string} hash @param {string} text */
export const link = (hash, text) => h("a", { text, attrs: { href: hash } })

/** The hash of a session's page. @param {string} id */
export const sessionHref = (id) => `#/sessions/${encodeURIComponent(id)}`

/** A session id that opens its page. @param {string} id */
export const sessionLink = (id) => link(sessionHref(id), id)

/** @param {string} state */
export const badge = (state) => h("span", { className: `badge state-${state}`, text: state })

/** @param {string[]} headers @param {(string | Node)[][]} rows @param {string} empty @param {string} [className] */
export const table = (headers, rows, empty, className = "") => {
  if (rows.length === 0) return h("p", { className: "muted empty", text: empty })
  return h("table", className === "" ? {} : { className }, [
    h("thead", {}, [h("tr", {}, headers.map((x) => h("th", { text: x })))]),
    h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => (typeof c === "string" ? h("td", { text: c }) : h("td", {}, [c])))))),
  ])
}

/** @param {string} label @param {string} text @param {string} [title] */
export const button = (label, text, title) => h("button", { text, attrs: { type: "button", "data-action": label }, ...(title === undefined ? {} : { title }) })

/** Says what an action did (or why it failed) in the page's notice line. @param {string} text @param {boolean} [failed] */
export const notice = (text, failed = false) => {
  const n = el("notice")
  n.textContent = text
  n.className = failed ? "notice error" : "notice"
  n.hidden = text === ""
}
