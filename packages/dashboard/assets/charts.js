// @ts-check
// Small time-series of the fleet signal (free RAM, the queue, parks) from the coordinator's
// samples (`/ui/history`): one SVG line each, with the value now and the range it covered.
import { h } from "./dom.js"
import { duration, mib } from "./format.js"

const SVG = "http://www.w3.org/2000/svg"
const WIDTH = 240
const HEIGHT = 48

/** @param {string} tag @param {Record<string, string>} attrs */
const svg = (tag, attrs) => {
  const node = document.createElementNS(SVG, tag)
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v)
  return node
}

/**
 * One chart: a line over time, scaled from 0 to `top` (or the largest value).
 * @param {{ key: string, title: string, at: number[], values: number[], format: (n: number) => string, top?: number }} c
 */
const chart = (c) => {
  const n = c.values.length
  const last = c.values[n - 1] ?? 0
  const min = Math.min(...c.values)
  const max = Math.max(...c.values)
  const span = n > 1 ? (c.at[n - 1] ?? 0) - (c.at[0] ?? 0) : 0
  const top = Math.max(c.top ?? 0, max, 1)
  const t0 = c.at[0] ?? 0
  const x = (/** @type {number} */ i) => (span > 0 ? (((c.at[i] ?? t0) - t0) / span) * WIDTH : WIDTH)
  const y = (/** @type {number} */ v) => HEIGHT - 2 - (Math.max(0, v) / top) * (HEIGHT - 4)
  const points = c.values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ")
  const summary = `${c.title}: now ${c.format(last)}; between ${c.format(min)} and ${c.format(max)} over the last ${duration(span)}`
  const plot = svg("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, preserveAspectRatio: "none", role: "img", "aria-label": summary, "data-points": String(n) })
  if (n > 1) {
    plot.append(svg("polygon", { class: "area", points: `${x(0).toFixed(1)},${HEIGHT} ${points} ${x(n - 1).toFixed(1)},${HEIGHT}` }))
    plot.append(svg("polyline", { class: "line", points }))
  }
  return h("figure", { className: "chart", attrs: { "data-series": c.key } }, [
    h("figcaption", {}, [h("span", { className: "chart-title", text: c.title }), h("span", { className: "chart-now", text: c.format(last) })]),
    plot,
    h("p", { className: "chart-range muted", text: n > 1 ? `${c.format(min)}–${c.format(max)} · last ${duration(span)}` : "collecting samples…" }),
  ])
}

/**
 * The three charts, or a line saying why there are none.
 * @param {{ intervalMs: number, samples: any[] } | null} history
 */
export const charts = (history) => {
  if (history === null || history.samples.length === 0)
    return [h("p", { className: "muted empty", text: history === null ? "This coordinator keeps no history." : "Collecting samples of the fleet…" })]
  const s = history.samples
  const at = s.map((x) => x.at)
  const count = (/** @type {number} */ v) => String(Math.round(v))
  return [
    chart({ key: "freeMib", title: "Free RAM", at, values: s.map((x) => x.freeMib), format: mib, top: Math.max(...s.map((x) => x.capacityMib)) }),
    chart({ key: "queue", title: "Queue", at, values: s.map((x) => x.queue), format: count }),
    chart({ key: "parks", title: "Parks", at, values: s.map((x) => x.parks), format: count }),
  ]
}
