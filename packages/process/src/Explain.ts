/**
 * Start-up failures said in one line. A failed listen or a refused database arrives as a
 * cause several errors deep (a `ServeError` around Node's `EADDRINUSE`, the store's
 * `Unavailable` around `ECONNREFUSED`); this module finds the system error in it and says what
 * happened and what to do, naming the setting.
 */
import { Cause } from "effect"

/** The chain of errors in a cause: each failure and defect, then their `cause`s. */
export const errors = (cause: Cause.Cause<unknown>): readonly unknown[] => {
  const out: unknown[] = []
  const walk = (e: unknown, depth: number) => {
    if (e === undefined || e === null || depth > 8) return
    out.push(e)
    if (typeof e === "object" && "cause" in e) walk((e as { cause: unknown }).cause, depth + 1)
  }
  for (const r of cause.reasons) {
    if (r._tag === "Fail") walk(r.error, 0)
    else if (r._tag === "Die") walk(r.defect, 0)
  }
  return out
}

/** Every message of the chain, outermost first. */
export const messages = (cause: Cause.Cause<unknown>): readonly string[] =>
  errors(cause)
    .map((e) => (e instanceof Error ? e.message : typeof e === "object" && e !== null && "message" in e ? String((e as { message: unknown }).message) : String(e)))
    .filter((m) => m.trim() !== "")

/** The first system error code in the chain (`EADDRINUSE`, `ECONNREFUSED`…), also when only a message names it. */
export const errnoCode = (cause: Cause.Cause<unknown>): string | null => {
  for (const e of errors(cause)) {
    const code = typeof e === "object" && e !== null && "code" in e ? (e as { code: unknown }).code : undefined
    if (typeof code === "string" && /^E[A-Z]+$/.test(code)) return code
  }
  for (const m of messages(cause)) {
    const found = /\b(E(?:ADDRINUSE|ACCES|ADDRNOTAVAIL|CONNREFUSED|CONNRESET|NOTFOUND|TIMEDOUT|HOSTUNREACH|AI_AGAIN))\b/.exec(m)
    if (found?.[1] !== undefined) return found[1]
  }
  return null
}

/** Where a service listens, for the lines below. */
export interface Listen {
  readonly host: string
  readonly port: number
  /** The setting that chose the port, e.g. `ENGRAM_PORT`. */
  readonly portVariable: string
}

/** A failed listen, in one line; null when the cause is not one. */
export const listenFailure = (cause: Cause.Cause<unknown>, at: Listen): string | null => {
  // Only a failed listen: an EACCES of a data directory is not one.
  const listening =
    errors(cause).some((e) => typeof e === "object" && e !== null && "syscall" in e && (e as { syscall: unknown }).syscall === "listen") ||
    messages(cause).some((m) => /^listen E[A-Z]+/.test(m))
  if (!listening) return null
  switch (errnoCode(cause)) {
    case "EADDRINUSE":
      return `port ${at.port} on ${at.host} is already in use: another engram process or program listens there. Stop it, or choose another port with ${at.portVariable}`
    case "EACCES":
      return `not allowed to listen on port ${at.port} on ${at.host} (ports below 1024 need privileges): choose another with ${at.portVariable}`
    case "EADDRNOTAVAIL":
      return `cannot listen on ${at.host}: this machine has no such address`
    default:
      return null
  }
}

/**
 * `postgres://user:secret@db:5432/engram` as `db:5432/engram`, and a URL of several hosts
 * (`…@db1:5432,db2:5432/engram`, which `URL` does not parse) as `db1:5432,db2:5432/engram`;
 * never the credentials.
 */
export const databaseWhere = (url: string): string => {
  try {
    const u = new URL(url)
    return `${u.hostname}${u.port === "" ? "" : `:${u.port}`}${u.pathname === "/" ? "" : u.pathname}`
  } catch {
    // Everything up to the last `@` may be credentials (a password may hold `/`, `?` or `#`): dropped.
    const scheme = /^[a-z]+:\/\//i.exec(url)
    if (scheme === null) return "the configured database"
    const rest = url.slice(url.lastIndexOf("@") + 1 || scheme[0].length)
    const m = /^([^/?#]+)(\/[^?#]*)?/.exec(rest)
    return m === null ? "the configured database" : `${m[1]}${m[2] === undefined || m[2] === "/" ? "" : m[2]}`
  }
}

/**
 * What one process needs of the database's connections, for the line on a server whose slots are
 * taken: `who` (each coordinator replica) needs `count` connections, `detail` what they are,
 * `lowerWith` the setting that needs fewer.
 */
export interface ConnectionsNeeded {
  readonly who: string
  readonly count: number
  readonly detail: string
  readonly lowerWith: string
}

/** PostgreSQL's refusals for want of a connection slot (SQLSTATE 53300, too_many_connections). */
const noSlot = /sorry, too many clients already|remaining connection slots are reserved[^|]*/i

/**
 * A database that refused, in one line; null when the cause is not one. `variable` names the
 * setting; `needs`, what this process needs of its connections (said when the server has no
 * connection slot left).
 */
export const databaseFailure = (cause: Cause.Cause<unknown>, url: string, variable = "ENGRAM_DATABASE_URL", needs?: ConnectionsNeeded): string | null => {
  const where = databaseWhere(url)
  const text = messages(cause).join(" | ")
  switch (errnoCode(cause)) {
    case "ECONNREFUSED":
      return `the database at ${where} refused the connection (${variable}): is PostgreSQL running and listening there?`
    case "ENOTFOUND":
    case "EAI_AGAIN":
      return `the database host in ${variable} (${where}) was not found`
    case "ETIMEDOUT":
    case "EHOSTUNREACH":
      return `the database at ${where} did not answer (${variable}): check the address and the network`
  }
  if (/password authentication failed|no pg_hba\.conf entry|role .* does not exist/i.test(text)) {
    return `the database at ${where} refused the credentials in ${variable}: ${/password authentication failed[^|]*|no pg_hba\.conf entry[^|]*|role "[^"]*" does not exist/i.exec(text)?.[0] ?? "authentication failed"}`
  }
  if (/database "[^"]*" does not exist/i.test(text)) return `the database at ${where} does not exist (${variable}): create it first`
  const refused = noSlot.exec(text)?.[0]
  if (refused !== undefined) {
    const need =
      needs === undefined
        ? "raise its max_connections or close some of its other clients"
        : `${needs.who} needs ${needs.count} connections (${needs.detail}): raise max_connections to cover ${needs.count} for every one plus the database's other clients, close some of those, or lower ${needs.lowerWith}`
    return `the database at ${where} has no connection slot left (${variable}; PostgreSQL said "${refused.trim()}"): ${need}`
  }
  return null
}

/** The cause in one line: its innermost message (the root of the chain), else its pretty form's first line. */
export const oneLine = (cause: Cause.Cause<unknown>): string => {
  const all = messages(cause)
  const first = all[0]
  const last = all.at(-1)
  if (first === undefined || last === undefined) return Cause.pretty(cause).split("\n")[0] ?? "failed"
  return first === last || first.includes(last) ? first : `${first}: ${last}`
}
