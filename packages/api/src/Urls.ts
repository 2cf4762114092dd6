/**
 * How a URL is shown where it may carry a secret (an echoed refused setting, a log line): the one
 * rule of the client's and the host agent's coordinator URLs (`@engram/client`'s
 * `Replicas.redactUrl`) and of the coordinator's own URL settings.
 */

/**
 * `value` (one URL or a comma-separated list) with what may hold a secret masked, for an echoed
 * refused value or a log line: any user information (everything before the last `@` of the
 * authority, as `new URL` reads it) and any query or fragment.
 */
export const redact = (value: string): string =>
  value
    .split(",")
    .map((item) => {
      const scheme = item.indexOf("//")
      const start = scheme < 0 ? 0 : scheme + 2
      // Not a URL at all but with an `@` (a password holding a `/`, say): nothing after the scheme is shown.
      if (item.includes("@") && !URL.canParse(item.trim())) return `${item.slice(0, start)}***`
      const rest = item.slice(start)
      // The authority ends at the path, query or fragment (whichever comes first).
      const end = rest.search(/[/?#]/)
      const authority = end < 0 ? rest : rest.slice(0, end)
      const tail = end < 0 ? "" : rest.slice(end)
      const at = authority.lastIndexOf("@")
      const host = at < 0 ? authority : `***@${authority.slice(at + 1)}`
      const cut = tail.search(/[?#]/)
      const path = cut < 0 ? tail : `${tail.slice(0, cut)}${tail[cut]}***`
      return item.slice(0, start) + host + path
    })
    .join(",")
