/**
 * The plot: one line per policy over simulated time, as a hand-written SVG of panels sharing
 * the time axis: the queue length (sampled at every reaper pass), and per time window the p99
 * queue wait, the share of resumes that were warm, and the descents started. Long series are
 * bucketed to at most `maxPoints` points per line: the queue keeps each bucket's maximum (its
 * spikes matter).
 */
import type { Result } from "./Simulation.js"

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
const W = 960
const PANEL_H = 160
const M = { left: 64, right: 180, top: 36, gap: 48, bottom: 40 }

const escape = (s: string): string => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")

const bucket = (t: readonly number[], y: readonly number[], maxPoints: number, how: "max" | "mean"): [number, number][] => {
  const n = t.length
  if (n <= maxPoints) return t.map((x, i) => [x, y[i] as number])
  const out: [number, number][] = []
  const size = n / maxPoints
  for (let b = 0; b < maxPoints; b++) {
    const from = Math.floor(b * size)
    const to = Math.max(from + 1, Math.floor((b + 1) * size))
    let acc = how === "max" ? Number.NEGATIVE_INFINITY : 0
    for (let i = from; i < to; i++) acc = how === "max" ? Math.max(acc, y[i] as number) : acc + (y[i] as number)
    out.push([t[from] as number, how === "max" ? acc : acc / (to - from)])
  }
  return out
}

const niceMax = (v: number): number => {
  if (v <= 0) return 1
  const p = Math.pow(10, Math.floor(Math.log10(v)))
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p
  return 10 * p
}

/** Renders the plot of `results` (one run per policy, same workload) as an SVG document. */
export const svg = (results: readonly Result[], title: string, maxPoints = 600): string => {
  const horizon = Math.max(1, ...results.map((r) => r.horizonMs))
  const plotW = W - M.left - M.right
  // Per-window figures are drawn at the middle of their window.
  const perWindow = (r: Result, f: (w: Result["windows"][number]) => number | null): [number, number][] => {
    const out: [number, number][] = []
    const half = (r.windows[1]?.startMs ?? horizon) / 2
    for (const w of r.windows) {
      const v = f(w)
      if (v !== null) out.push([Math.min(horizon, w.startMs + half), v])
    }
    return out
  }
  const panels: { label: string; line: (r: Result) => [number, number][] }[] = [
    { label: "queue length (sessions, max per bucket)", line: (r) => bucket(r.series.tMs, r.series.queue, maxPoints, "max") },
    { label: "queue wait p99 per window (s)", line: (r) => perWindow(r, (w) => w.waitP99Ms / 1000) },
    { label: "warm share of resumes per window (%)", line: (r) => perWindow(r, (w) => (w.warm + w.cold > 0 ? (100 * w.warm) / (w.warm + w.cold) : null)) },
    { label: "descents started per window", line: (r) => perWindow(r, (w) => w.descents) },
  ]
  const H = M.top + panels.length * PANEL_H + (panels.length - 1) * M.gap + M.bottom
  const parts: string[] = []
  parts.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`)
  parts.push(`<rect width="${W}" height="${H}" fill="white"/>`)
  parts.push(`<text x="${M.left}" y="20" font-size="14" font-weight="bold">${escape(title)}</text>`)
  const hours = horizon / 3_600_000
  const stepH = hours <= 12 ? 1 : hours <= 48 ? 3 : 12
  panels.forEach((panel, p) => {
    const top = M.top + p * (PANEL_H + M.gap)
    const lines = results.map((r) => panel.line(r))
    const yMax = niceMax(Math.max(0, ...lines.flatMap((l) => l.map(([, y]) => y))))
    const x = (t: number): number => M.left + (t / horizon) * plotW
    const y = (v: number): number => top + PANEL_H - (v / yMax) * PANEL_H
    parts.push(`<text x="${M.left}" y="${top - 8}" font-weight="bold">${escape(panel.label)}</text>`)
    parts.push(`<rect x="${M.left}" y="${top}" width="${plotW}" height="${PANEL_H}" fill="none" stroke="#999"/>`)
    for (let k = 0; k <= 4; k++) {
      const v = (yMax * k) / 4
      const yy = y(v).toFixed(1)
      parts.push(`<line x1="${M.left}" x2="${M.left + plotW}" y1="${yy}" y2="${yy}" stroke="#eee"/>`)
      parts.push(`<text x="${M.left - 6}" y="${yy}" text-anchor="end" dominant-baseline="middle">${Number.isInteger(v) ? v : v.toFixed(1)}</text>`)
    }
    for (let h = 0; h <= hours; h += stepH) {
      const xx = x(h * 3_600_000).toFixed(1)
      parts.push(`<line x1="${xx}" x2="${xx}" y1="${top}" y2="${top + PANEL_H}" stroke="#f0f0f0"/>`)
      parts.push(`<text x="${xx}" y="${top + PANEL_H + 14}" text-anchor="middle">${h}h</text>`)
    }
    lines.forEach((line, i) => {
      if (line.length === 0) return
      const d = line.map(([t, v], j) => `${j === 0 ? "M" : "L"}${x(t).toFixed(1)},${y(v).toFixed(1)}`).join("")
      parts.push(`<path d="${d}" fill="none" stroke="${COLORS[i % COLORS.length]}" stroke-width="1.3"/>`)
    })
  })
  results.forEach((r, i) => {
    const yy = M.top + 10 + i * 18
    const xx = W - M.right + 16
    parts.push(`<line x1="${xx}" x2="${xx + 20}" y1="${yy}" y2="${yy}" stroke="${COLORS[i % COLORS.length]}" stroke-width="3"/>`)
    parts.push(`<text x="${xx + 26}" y="${yy}" dominant-baseline="middle">${escape(r.policy)}</text>`)
  })
  parts.push(`<text x="${M.left + plotW / 2}" y="${H - 8}" text-anchor="middle">simulated time</text>`)
  parts.push("</svg>")
  return `${parts.join("\n")}\n`
}
