/**
 * Which server of a connection URL the store's connections take. A URL may name several hosts
 * (`postgres://u@db1:5432,db2:5432/engram`, as libpq): postgres.js tries them in order and takes
 * the first that answers, a standby too, where every write then fails (25006, `ReadOnly`) for as
 * long as the connection lives. Such a URL gets `target_session_attrs=read-write` (libpq's
 * meaning: a server that takes writes; the others are skipped) unless the URL or
 * `PGTARGETSESSIONATTRS` chooses: after a failover the store's connections find the new primary.
 * A URL of one host is left as it is (a standby's reads keep answering, its writes say
 * `ReadOnly`).
 */

/** The hosts a connection URL names (`host[:port]`, comma-separated). */
export const hostsOf = (url: string): readonly string[] => {
  const rest = url.slice(url.indexOf("://") + 3)
  const authority = rest.split(/[/?#]/)[0] ?? ""
  return authority
    .slice(authority.lastIndexOf("@") + 1)
    .split(",")
    .filter((h) => h !== "")
}

/** The postgres.js option for `url`'s connections (empty when the URL or the environment chooses, or names one host). */
export const sessionAttrsFor = (url: string, env: Readonly<Record<string, string | undefined>> = process.env): { readonly target_session_attrs?: "read-write" } => {
  if (hostsOf(url).length < 2) return {}
  if (/[?&]target_session_attrs=/.test(url) || (env["PGTARGETSESSIONATTRS"] ?? "") !== "") return {}
  return { target_session_attrs: "read-write" }
}
