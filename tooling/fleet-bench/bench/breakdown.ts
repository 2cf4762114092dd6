/**
 * Where a database's transactions come from: PostgreSQL run with `log_statement=all` and each
 * line prefixed by its virtual transaction id (`%v`), the lines of a window grouped by that id,
 * and each transaction named by its first statement (BEGIN, COMMIT and the leadership fence
 * skipped), its literals and parameters blanked.
 */

/** The server settings that make the log this reads. */
export const statementLogSettings = { log_statement: "all", log_line_prefix: "%v|" } as const

const skipped = /^(begin|commit|rollback|start transaction|select epoch from leases where name = \$1 for share)\b/i

/** A statement's shape: parameters, numbers and quoted text blanked, spaces folded, cut to 110 characters. */
const shapeOf = (text: string): string =>
  text
    .replace(/\$\d+/g, "?")
    .replace(/'(?:[^']|'')*'/g, "?")
    .replace(/\b\d+\b/g, "?")
    .replace(/\s+/g, " ")
    .trim()
    .slice(0, 110)

/** Collects log lines while on; answers the transactions by shape, most first. */
export const makeBreakdown = () => {
  let on = false
  const byTx = new Map<string, string>()
  const line = (l: string): void => {
    if (!on) return
    const m = /^(\d+\/\d+)\|LOG:\s+(?:statement|execute [^:]*):\s*(.*)$/.exec(l)
    if (m === null) return
    const [, vxid, text] = m as unknown as [string, string, string]
    if (byTx.has(vxid) && byTx.get(vxid) !== "") return
    byTx.set(vxid, skipped.test(text.trim()) ? "" : shapeOf(text))
  }
  return {
    line,
    start: () => {
      byTx.clear()
      on = true
    },
    stop: (): { readonly shape: string; readonly count: number }[] => {
      on = false
      const counts = new Map<string, number>()
      for (const shape of byTx.values()) counts.set(shape === "" ? "(only BEGIN/COMMIT/fence)" : shape, (counts.get(shape === "" ? "(only BEGIN/COMMIT/fence)" : shape) ?? 0) + 1)
      return [...counts].map(([shape, count]) => ({ shape, count })).sort((a, b) => b.count - a.count)
    },
  }
}
