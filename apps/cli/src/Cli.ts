/**
 * The `engram` command line: `status`, `hosts …`, `sessions …`, `why`, `reservations …`,
 * `watch`, over `@engram/client`; every group lists with `ls` and reads one with `show`.
 * Every command prints an aligned, human-readable answer
 * (RAM in GiB, ages, reasons summed) or, with `--json`, the records as the API answered them.
 * `--url`/`--token` (or `ENGRAM_URL`/`ENGRAM_TOKEN`, or `.engram/admin-token`) choose the
 * coordinator. Errors are one line on stderr (`Errors.describe`: the field and the rule of a
 * 400, the estimate of a refused move) and exit 1; a usage error exits 2.
 */
import { Errors, make as makeClient } from "@engram/client"
import { Names } from "@engram/core"
import type { EngramClientShape, Move, PlaceAnswer, Records } from "@engram/client"
import { Data, Effect, Option } from "effect"
import { Argument, CliOutput, Command, Flag } from "effect/cli"
import { FetchHttpClient } from "effect/http"
import * as Format from "./Format.js"
import * as Hung from "./Hung.js"
import type { Target } from "./Target.js"
import { isLoopback, resolveTarget } from "./Target.js"
import * as Why from "./Why.js"

/** The version `--version` prints. */
export const version = "0.1.0"

/** A problem with the command line itself (no token found, a bad value): exit 2. */
export class UsageError extends Data.TaggedError("UsageError")<{ readonly message: string }> {}

/** The coordinator refused or failed: exit 1, said in one line. */
export class CallFailed extends Data.TaggedError("CallFailed")<{ readonly message: string; readonly error: Errors.ClientError }> {}

/** Where the CLI writes (a test may capture it). */
export interface Output {
  readonly out: (text: string) => void
  readonly isTTY: boolean
}

/** stdout. */
export const stdout: Output = { out: (text) => void process.stdout.write(text.endsWith("\n") ? text : `${text}\n`), isTTY: process.stdout.isTTY === true }

let output: Output = stdout
const print = (text: string) => Effect.sync(() => output.out(text))
const printJson = (value: unknown) => print(JSON.stringify(value, null, 2))

// ---- the root and its shared flags ------------------------------------------------------------

const engram = Command.make("engram").pipe(
  Command.withSharedFlags({
    url: Flag.String("url").pipe(Flag.optional, Flag.withDescription("the coordinator's URL, or its replicas' comma-separated, tried in turn (ENGRAM_URL; default http://127.0.0.1:7070, or ENGRAM_PORT)")),
    token: Flag.String("token").pipe(
      Flag.optional,
      Flag.withDescription(
        "the admin token; other local users can read it in the process list, and it stays in your shell history: prefer ENGRAM_TOKEN or the token file (default: .engram/admin-token found from here up)",
      ),
    ),
    json: Flag.Boolean("json").pipe(Flag.withDefault(false), Flag.withDescription("print the API's records as JSON")),
  }),
  Command.withDescription("engram: the fleet's hosts, sessions, queue and reservations, from the command line. engram coordinator and engram agent run the services (engram coordinator --help)."),
)

/**
 * How long one try on one replica may go unanswered (`ENGRAM_TIMEOUT_MS`, ms, an integer > 0 by
 * core's rule for an integer read from text, `Names.decimalInt`, as the host agent's settings:
 * not trimmed, no hex or exponent; unset or empty: the client's 30 s): undefined for the default,
 * or the usage error's words.
 */
export const callTimeoutMs = (env: Readonly<Record<string, string | undefined>>): number | undefined | string => {
  const raw = env["ENGRAM_TIMEOUT_MS"]
  if (raw === undefined || raw === "") return undefined
  const n = Names.decimalInt.test(raw) ? Number(raw) : Number.NaN
  return n > 0 ? n : `ENGRAM_TIMEOUT_MS ${JSON.stringify(raw)}: must be an integer > 0 (ms)`
}

/** The shared flags, the target they resolve to, and a client on it. */
const context = Effect.gen(function* () {
  const flags = yield* engram
  const target = resolveTarget({ url: Option.getOrUndefined(flags.url), token: Option.getOrUndefined(flags.token) })
  if ("problem" in target) return yield* new UsageError({ message: target.problem })
  if (target.token === null) {
    return yield* new UsageError({
      message: target.urls.every(isLoopback)
        ? "no token: pass --token, set ENGRAM_TOKEN, or run where the coordinator wrote .engram/admin-token (pnpm start at the repository root does)"
        : `no token: pass --token or set ENGRAM_TOKEN (${target.urlSource} names a coordinator on another machine: a local .engram/admin-token is not sent there)`,
    })
  }
  const timeoutMs = callTimeoutMs(process.env)
  if (typeof timeoutMs === "string") return yield* new UsageError({ message: timeoutMs })
  // A replica that hung lately is tried last (Hung.ts), so a frozen first replica costs one timeout a minute, not one a command.
  const memory = target.urls.length > 1 ? Hung.hungFile(process.env) : null
  const baseUrl = memory === null ? target.urls : Hung.ordered(target.urls, Hung.recent(memory, Date.now()))
  const onHung = memory === null ? undefined : (url: string) => Hung.remember(memory, url, Date.now())
  const client = yield* makeClient({ baseUrl, token: target.token, timeoutMs, onHung }).pipe(Effect.provide(FetchHttpClient.layer))
  return { json: flags.json, target, client }
})

/** A client error as one line, with a hint where the error is about the target. */
export const explain = (e: Errors.ClientError, target: Target): string => {
  if (e instanceof Errors.TransportError) {
    // Only the replicas the call tried: one not safe to repeat stops at the first that may have received it.
    const tried =
      target.urls.length <= 1
        ? ""
        : e.tried.length >= target.urls.length
          ? ` (tried each of ${e.tried.join(", ")})`
          : e.tried.length > 1
            ? ` (tried ${e.tried.join(", ")})` : ` (tried only ${e.url} of ${target.urls.length} replicas: the call is not repeated on another once one may have received it)`
    // A hang is not a coordinator that is down: the connection was taken, no answer came.
    return e.timedOut
      ? `${e.message}${tried}. The coordinator took the connection but did not answer in time: it is frozen or overloaded (look at its /readyz and its log), or the call needs longer (ENGRAM_TIMEOUT_MS).`
      : `${e.message}${tried}. Is the coordinator running (pnpm start)? Or point --url / ENGRAM_URL at it.`
  }
  if (e instanceof Errors.Unauthorized) return `the coordinator at ${target.url} refused the token from ${target.tokenSource ?? "nowhere"}: ${e.message}`
  if (e instanceof Errors.Forbidden) return `${e.message} (the token from ${target.tokenSource ?? "nowhere"} is not the admin token)`
  return Errors.describe(e)
}

/** Runs a call; its failure becomes one line. */
const call = <A>(target: Target, eff: Effect.Effect<A, Errors.ClientError>) =>
  Effect.mapError(eff, (error) => new CallFailed({ message: explain(error, target), error }))

// ---- flags and arguments ----------------------------------------------------------------------

const id = (what: string) => Argument.String("id").pipe(Argument.withDescription(what))
const memFlag = Flag.String("mem").pipe(
  Flag.filterMap(
    (t) => Option.fromNullishOr(Format.parseMib(t)),
    () => "a RAM size above 0 in MiB, GiB or TiB (1024-based; MB/GB are not taken): 1024 (MiB), 512MiB, 1GiB or 1.5g",
  ),
  Flag.withDescription("RAM, 1024-based: 1024 (MiB), 512MiB, 1GiB, 1.5g (GB/MB are refused: write GiB/MiB)"),
)
/** An optional lifetime flag: a duration, sent as ms (the coordinator refuses one out of range by name). */
const lifetimeFlag = (name: string, description: string) =>
  Flag.String(name).pipe(
    Flag.filterMap(
      (t) => Option.fromNullishOr(Format.parseMs(t)),
      () => "a duration above 0: 90s, 5m, 2h",
    ),
    Flag.optional,
    Flag.withDescription(description),
  )
/** A whole number above 0 in decimal digits (effect's `Flag.Int` also takes `1e3` as 1000). */
const wholeFlag = (name: string) =>
  Flag.String(name).pipe(
    Flag.filterMap(
      (t) => Option.fromNullishOr(Format.parseWhole(t)),
      () => "a whole number above 0, in decimal digits",
    ),
  )
const vcpuFlag = wholeFlag("vcpus").pipe(Flag.withDescription("vCPUs"))
const stateFlag = Flag.String("state").pipe(Flag.optional, Flag.withDescription("only sessions in this state (queued, pending, running, parked, descending, descended, moving, ended, lost)"))
const hostFlag = Flag.String("host").pipe(Flag.optional, Flag.withDescription("only this host's"))

// ---- views ------------------------------------------------------------------------------------

/** The silent hosts of a fleet signal, when any (an older coordinator does not count them). */
const silentNote = (f: Records.Fleet): string =>
  f.hosts.silent === undefined || f.hosts.silent === 0
    ? ""
    : `; ${f.hosts.silent} silent (no report within the stale window: take nothing until their agents report${f.silentFreeMib === undefined || f.silentFreeMib === 0 ? "" : `; ${Format.mib(f.silentFreeMib)} of the free RAM is theirs`})`

/** A host's state as shown: `ready, silent` while its agent is silent (its state is unchanged, but it takes nothing). */
const stateOf = (h: Records.Host): string => (h.silent === true ? `${h.state}, silent` : h.state)

const statusText = (f: Records.Fleet): string => {
  const h = f.hosts
  const lines: (readonly [string, string])[] = [
    ["hosts", `${h.total} (${h.ready} ready, ${h.cordoned} cordoned, ${h.draining} draining; ${h.measured} measured)${silentNote(f)}`],
    ["RAM", `${Format.mib(f.freeMib)} free of ${Format.mib(f.capacityMib)} (${Format.mib(f.reservedMib)} reserved)`],
    ["vCPUs", `${f.freeVcpus} free of ${f.cpuBudget} (${f.reservedVcpus} reserved)`],
    [
      "queue",
      f.queue.sessions === 0
        ? "empty"
        : `${f.queue.sessions} waiting for ${Format.mib(f.queue.memMib)} and ${Format.vcpus(f.queue.vcpus)}; ${f.queue.withoutRoom} without room anywhere`,
    ],
  ]
  if (f.unplaceable !== undefined && f.unplaceable.count > 0) {
    lines.push(["unplaceable", `${f.unplaceable.count} too big for any host even empty (largest ${Format.mib(f.unplaceable.largestMemMib)}, ${Format.vcpus(f.unplaceable.largestVcpus)}): add a bigger host`])
  }
  lines.push(["parks", `${f.parks} (paused in RAM, resume warm)`], ["descents", `${f.descentsRunning} running`], ["read at", new Date(f.readAt).toISOString()])
  return Format.fields(lines)
}

/**
 * The hosts as table rows, with how long ago each last reported (`now`): a host whose agent froze
 * or lost its network stays `ready`; past the stale window the coordinator flags it silent (the
 * state column says `ready, silent`: it takes nothing), and its report's age says how long.
 */
const hostRows = (hosts: readonly Records.Host[], now: number) =>
  hosts.map((h) => [
    h.id,
    stateOf(h),
    h.allocatableMib === null ? `${Format.mib(h.reservedMib)}/-` : `${Format.mib(h.reservedMib)}/${Format.mib(h.allocatableMib)}`,
    Format.mib(h.freeMib),
    h.cpuBudget === null ? `${h.reservedVcpus}/-` : `${h.reservedVcpus}/${h.cpuBudget}`,
    h.freeVcpus === null ? "-" : String(h.freeVcpus),
    String(h.entries),
    String(h.parks),
    String(h.descentsRunning),
    h.reportedAt === null ? "never" : `${Format.age(h.reportedAt, now)} ago`,
  ])
const hostHeaders = ["HOST", "STATE", "RAM RESERVED", "RAM FREE", "VCPUS", "VCPUS FREE", "ENTRIES", "PARKS", "DESCENTS", "REPORTED"]

const hostText = (h: Records.Host): string =>
  Format.fields([
    ["host", h.id],
    [
      "state",
      `${h.state}${h.measured ? "" : " (not measured yet: takes nothing until it reports)"}${h.silent === true ? " (silent: its agent has not reported within the stale window; takes nothing until it does)" : ""}`,
    ],
    ["RAM", `${Format.mib(h.reservedMib)} reserved of ${Format.mib(h.allocatableMib)} (${Format.mib(h.freeMib)} free; reported ${Format.mib(h.reportedAllocatableMib)} allocatable)`],
    ["vCPUs", `${h.reservedVcpus} reserved of ${h.cpuBudget ?? "-"} (${h.freeVcpus ?? "-"} free; ${h.report?.totalVcpus ?? "-"} cores)`],
    ["entries", String(h.entries)],
    ["parks", String(h.parks)],
    ["descents", `${h.descentsRunning} running`],
    ["labels", Object.entries(h.labels).map(([k, v]) => `${k}=${v}`).join(" ") || "-"],
    ["templates", (h.report?.templates ?? []).map((t) => `${t.name} (${Format.mib(t.memMib)}, ${Format.vcpus(t.vcpus)})`).join(", ") || "-"],
    ["reported", h.reportedAt === null ? "never" : `${Format.age(h.reportedAt, Date.now())} ago`],
  ])

/** Where a commit allowance came from, for a person (SPEC §13). */
const allowanceSourceText = (source: Records.AllowanceSource, samples: number): string =>
  source === "prior"
    ? "the prior (no recent commits between these hosts, too few into the target or anywhere)"
    : source === "learned"
      ? `learned from the last ${samples} recent commits between these hosts`
      : source === "target"
        ? `learned from ${samples} recent commits into the target host (too few between these hosts)`
        : `learned from ${samples} recent commits of the fleet (too few between these hosts or into the target)`

/** A signed difference in ms: how far an estimate was off (`+25 ms` pessimistic, `-12 ms` short). */
const offBy = (ms: number) => `${ms >= 0 ? "+" : "-"}${Math.round(Math.abs(ms))} ms`

/**
 * A move's resend mark for a person: its source holds the guest's only whole copy, paused, and
 * owes the target the stream (the move was committed without its pause measured, and the target
 * never got a complete stream). Its agent streams it again; should the target die while the mark
 * is set (its agent sets it again after every answer of the target that it runs nothing), the
 * session goes back to the source.
 */
const resendOwedText = "owed: the source holds the only copy of the guest (paused) and owes the target the stream; should the target die while this is set (the source sets it again whenever the target answers that it runs nothing), the session goes back to the source"

/** Who committed a move, for a person. */
const committedByText: Record<Records.MoveCommittedBy, string> = {
  source: "its source (phases measured)",
  target: "its target's resolution (it runs the guest)",
  operator: "an operator (engram moves commit)",
}

/** One move for a person: its hosts and state, who committed it, its pause by phase, what its downtime guard decided on, and whether its source owes a resend. */
const moveText = (m: Move): string => {
  const g = m.guard ?? null
  const allowanceFrom = (x: Records.MoveGuard) => allowanceSourceText(x.allowanceSource, x.allowanceSamples)
  return Format.fields([
    ["move", m.id],
    ["session", m.sessionId],
    ["from → to", `${m.sourceHostId} → ${m.targetHostId}`],
    ["state", m.state === "pending" && m.rounds.some((r) => r.kind === "final" || r.kind === "intent") ? "pending (in doubt: past the point of no return)" : m.state],
    ...(m.committedBy === null ? [] : ([["committed by", committedByText[m.committedBy]]] as const)),
    ["budget", Format.duration(m.maxDowntimeMs)],
    ["rounds", m.rounds.length === 0 ? "none" : m.rounds.map((r) => r.kind).join(", ")],
    ...(m.phases === null
      ? []
      : ([["paused", `${Format.duration(m.phases.downtimeMs)} (capture ${Format.duration(m.phases.captureMs)}, send ${Format.duration(m.phases.sendMs)}, commit ${Format.duration(m.phases.commitMs)})`]] as const)),
    ...(g === null
      ? []
      : ([
          ["allowance", `${Format.duration(g.allowanceMs)}: ${allowanceFrom(g)}; off by ${offBy(g.allowanceErrorMs)} against the commit`],
          ["estimate", `${Format.duration(g.estimateMs)}; off by ${offBy(g.estimateErrorMs)} against the pause`],
        ] as const)),
    ...(m.abortReason === null ? [] : ([["aborted", m.abortReason]] as const)),
    ...(m.resendOwed ? ([["resend", resendOwedText]] as const) : []),
  ])
}

/** Since when a session is in its state: parked or queued time, else its last change. */
const since = (s: Records.Session) => (s.state === "parked" ? s.parkedAt : s.state === "queued" ? s.queuedAt : s.updatedAt)

const sessionRows = (sessions: readonly Records.Session[], now: number) =>
  sessions.map((s) => [s.id, s.state, s.hostId ?? "-", Format.mib(s.budget.memMib), String(s.budget.vcpus), Format.age(since(s), now)])
const sessionHeaders = ["SESSION", "STATE", "HOST", "MEM", "VCPUS", "FOR"]

const sessionText = (s: Records.SessionDetail): string => {
  const now = Date.now()
  const lines: (readonly [string, string])[] = [
    ["session", s.id],
    ["state", `${s.state} for ${Format.age(since(s), now)}`],
    ["host", s.hostId ?? "-"],
    ["budget", `${Format.mib(s.budget.memMib)}, ${Format.vcpus(s.budget.vcpus)}`],
    ["affinity", s.affinity.length === 0 ? "-" : s.affinity.join(", ")],
    ["template", s.template ?? "-"],
    ["reservation", s.reservationId ?? "-"],
    ["created", `${Format.age(s.createdAt, now)} ago`],
  ]
  if (s.queue !== undefined && s.queue !== null) lines.push(["queue", `position ${s.queue.position}; ${Why.summarize(s.queue.noFit)}`])
  return Format.fields(lines)
}

const placeText = (a: PlaceAnswer, verb: "created" | "resumed"): string => {
  if (a.outcome === "queued") {
    const tooBig = a.tooBig === true ? " No host could take it even empty: add a bigger host." : ""
    return `${a.id} queued at position ${a.position}: ${Why.summarize(a.noFit)}.${tooBig} (engram why ${a.id})`
  }
  if (a.resumed === "warm") return `${a.id} resumed warm on ${a.hostId} (${a.state}): unparked where it was`
  if (a.resumed === "cold") return `${a.id} restoring on ${a.hostId} (${a.state}): placed again from its descent image`
  return `${a.id} ${verb === "created" ? "placed" : "resumed"} on ${a.hostId} (${a.state})`
}

// ---- commands ---------------------------------------------------------------------------------

const status = Command.make("status", {}, () =>
  Effect.gen(function* () {
    const { client, json, target } = yield* context
    const fleet = yield* call(target, client.fleet.snapshot())
    yield* json ? printJson(fleet) : print(statusText(fleet))
  }),
).pipe(Command.withDescription("the fleet signal: hosts, free RAM and vCPUs, the queue, parks and descents"))

const hostAction = (name: "cordon" | "uncordon" | "drain", description: string, said: (id: string) => string) =>
  Command.make(name, { id: id("the host") }, (a) =>
    Effect.gen(function* () {
      const { client, json, target } = yield* context
      const h = yield* call(target, client.hosts[name](a.id))
      yield* json ? printJson(h) : print(said(h.id))
    }),
  ).pipe(Command.withDescription(description))

/** What to do with a host's new token: its agent needs it, and it is shown this once. */
const tokenHint = (id: string, what: string) => `(${what} of ${id}: start its agent with ENGRAM_HOST_ID=${id} and ENGRAM_HOST_TOKEN set to it; it is not shown again)`

/**
 * What a rotation does to the host's running agent (SPEC §13: revocation is immediate): it is
 * refused with the old token and stops, and the reaper reclaims its sessions once its heartbeats
 * are older than the coordinator's stale window. The CLI cannot read the window: it names it.
 */
const rotateWarning = (id: string) =>
  `warning: the agent running on ${id} is refused at once (401) and stops (exit 3); restart it with the new token within the heartbeat stale window (the coordinator's ENGRAM_HEARTBEAT_STALE_WINDOW_MS, default 120000 ms: 2 min), or its sessions are reclaimed as stale and lost`

const hosts = Command.make("hosts").pipe(
  Command.withDescription("the hosts: ls, show, add, cordon, uncordon, drain, rm, rotate-token"),
  Command.withSubcommands([
    Command.make(
      "add",
      {
        id: id("the new host's id"),
        label: Flag.KeyValuePair("label").pipe(Flag.optional, Flag.withDescription("a label, key=value (repeat the flag for more)")),
      },
      (a) =>
        Effect.gen(function* () {
          const { client, json, target } = yield* context
          const labels = Option.getOrUndefined(a.label)
          const created = yield* call(target, client.hosts.create(labels === undefined ? { id: a.id } : { id: a.id, labels })).pipe(
            Effect.mapError((e) =>
              e.error instanceof Errors.Conflict ? new CallFailed({ error: e.error, message: `host ${a.id} is already registered (engram hosts rotate-token ${a.id} gives its agent a new token)` }) : e,
            ),
          )
          yield* json
            ? printJson(created)
            : print(`${created.token}\n${tokenHint(created.id, "the token")}; it takes sessions once its agent reports`)
        }),
    ).pipe(Command.withDescription("register a host: prints the token its agent uses")),
    Command.make("ls", {}, () =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        const all = yield* call(target, client.hosts.listAll())
        yield* json ? printJson(all) : print(all.length === 0 ? "no hosts registered" : Format.table(hostHeaders, hostRows(all, Date.now())))
      }),
    ).pipe(Command.withDescription("every host with its room")),
    Command.make("show", { id: id("the host") }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        const h = yield* call(target, client.hosts.get(a.id))
        yield* json ? printJson(h) : print(hostText(h))
      }),
    ).pipe(Command.withDescription("one host")),
    Command.make("allowances", { id: id("the source host") }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        const r = yield* call(target, client.hosts.allowances(a.id))
        if (json) return yield* printJson(r)
        const rows = r.items.map((p) => [p.targetHostId, Format.duration(p.allowanceMs), p.source, String(p.samples), p.commitsMs.map((ms) => Math.round(ms)).join(" ")])
        yield* print(
          `${rows.length === 0 ? "no commits from this host yet" : Format.table(["TO", "ALLOWANCE", "FROM", "COMMITS", "RECENT COMMITS (ms)"], rows)}\ncommits older than ${Format.duration(r.horizonMs)} no longer count; a pair with too few recent ones learns from its target's, then the fleet's (a pool counts from 5); else the prior, ${Format.duration(r.priorMs)}`,
        )
      }),
    ).pipe(Command.withDescription("the downtime guard's learned commit allowance of moves from a host, per target host")),
    hostAction("cordon", "take no new sessions; what runs there stays", (h) => `${h} cordoned: it takes no new sessions; what runs there stays`),
    hostAction("uncordon", "take sessions again", (h) => `${h} is ready: it takes sessions again`),
    hostAction("drain", "take no new sessions (state draining)", (h) => `${h} draining: it takes no new sessions`),
    Command.make("rm", { id: id("the host") }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        yield* call(target, client.hosts.remove(a.id))
        yield* json ? printJson({ id: a.id, removed: true }) : print(`${a.id} removed`)
      }),
    ).pipe(Command.withDescription("remove a host (refused while it holds reservations)")),
    Command.make("rotate-token", { id: id("the host") }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        const t = yield* call(target, client.hosts.rotateToken(a.id))
        yield* json
          ? printJson({ id: a.id, token: t.token })
          : print(`${t.token}\n${tokenHint(a.id, "the new token")}; the old token no longer works\n${rotateWarning(a.id)}`)
      }),
    ).pipe(Command.withDescription("give a host's agent a new token; the old one stops working at once, and so does its running agent")),
  ]),
)

const sessions = Command.make("sessions").pipe(
  Command.withDescription("the sessions: ls, show, create, idle, resume, end, ttl, move, wait, events"),
  Command.withSubcommands([
    Command.make("ls", { state: stateFlag, host: hostFlag }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        const state = Option.getOrUndefined(a.state) as Records.SessionState | undefined
        const all = yield* call(target, client.sessions.listAll({ state, hostId: Option.getOrUndefined(a.host) }))
        yield* json ? printJson(all) : print(all.length === 0 ? "no sessions" : Format.table(sessionHeaders, sessionRows(all, Date.now())))
      }),
    ).pipe(Command.withDescription("sessions, oldest first")),
    Command.make("show", { id: id("the session") }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        const s = yield* call(target, client.sessions.get(a.id))
        yield* json ? printJson(s) : print(sessionText(s))
      }),
    ).pipe(Command.withDescription("one session")),
    Command.make(
      "create",
      {
        mem: memFlag,
        vcpus: vcpuFlag,
        id: Flag.String("id").pipe(Flag.optional, Flag.withDescription("your id for it (default: a UUID)")),
        affinity: Flag.String("affinity").pipe(Flag.optional, Flag.withDescription("hosts to prefer, comma-separated, in order")),
        refuse: Flag.Boolean("refuse").pipe(Flag.withDefault(false), Flag.withDescription("fail instead of queueing when nothing fits")),
        idleTimeout: lifetimeFlag("idle-timeout", "idle after this long with no guest activity (the gate parks or descends it): 5m, 30s"),
        ttl: lifetimeFlag("ttl", "ended this long after its create, whatever its state: 2h, 30m"),
        template: Flag.String("template").pipe(
          Flag.optional,
          Flag.withDescription("start it from this template instead of a boot (hosts holding it are preferred)"),
        ),
      },
      (a) =>
        Effect.gen(function* () {
          const { client, json, target } = yield* context
          const affinity = Option.getOrUndefined(a.affinity)
            ?.split(",")
            .map((s) => s.trim())
            .filter((s) => s !== "")
          const placed = yield* call(
            target,
            client.sessions.create({
              id: Option.getOrUndefined(a.id),
              memMib: a.mem,
              vcpus: a.vcpus,
              affinity,
              onNoRoom: a.refuse ? "refuse" : undefined,
              idleTimeoutMs: Option.getOrUndefined(a.idleTimeout),
              ttlMs: Option.getOrUndefined(a.ttl),
              template: Option.getOrUndefined(a.template),
            }),
          )
          yield* json ? printJson(placed) : print(placeText(placed, "created"))
        }),
    ).pipe(Command.withDescription("create a session: placed on the best-fitting host, or queued")),
    Command.make("idle", { id: id("the session") }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        const s = yield* call(target, client.sessions.idle(a.id))
        const said = s.state === "parked" ? "parked: paused in RAM, resumes warm" : `${s.state}: captured to storage, its room released`
        yield* json ? printJson(s) : print(`${s.id} ${said}`)
      }),
    ).pipe(Command.withDescription("a running session went idle: it parks or descends")),
    Command.make("resume", { id: id("the session") }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        const r = yield* call(target, client.sessions.resume(a.id))
        yield* json ? printJson(r) : print(placeText(r, "resumed"))
      }),
    ).pipe(Command.withDescription("bring a session back: warm from a park, cold from a descent")),
    Command.make("end", { id: id("the session") }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        // Ending is idempotent; reading first lets the answer say whether this call ended it.
        const before = yield* call(target, client.sessions.get(a.id))
        const s = yield* call(target, client.sessions.end(a.id))
        yield* json ? printJson(s) : print(before.state === "ended" ? `${s.id} was already ended: nothing to do` : `${s.id} ended`)
      }),
    ).pipe(Command.withDescription("end a session; its room is released (an ended session stays ended)")),
    Command.make("ttl", { id: id("the session"), ttl: Argument.String("duration").pipe(Argument.filterMap((t) => Option.fromNullishOr(Format.parseMs(t)), () => "a duration above 0: 1h, 30m, 90s")) }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        const s = yield* call(target, client.sessions.setTtl(a.id, a.ttl))
        yield* json ? printJson(s) : print(`${s.id} ends in ${Format.duration(a.ttl)} (${s.state})`)
      }),
    ).pipe(Command.withDescription("set a session's TTL anew: it ends this long from now, whatever its state")),
    Command.make(
      "move",
      {
        id: id("the session"),
        maxDowntime: Flag.String("max-downtime").pipe(
          Flag.filterMap(
            (t) => Option.fromNullishOr(Format.parseMs(t)),
            () => "a duration above 0: 600ms, 0.5s",
          ),
          Flag.withDescription("the longest pause the guest may see: 600ms, 1s"),
        ),
        to: Flag.String("to").pipe(Flag.optional, Flag.withDescription("the target host (default: the best-ranked other host that takes moves: its agent advertises a peer URL)")),
      },
      (a) =>
        Effect.gen(function* () {
          const { client, json, target } = yield* context
          const m = yield* call(target, client.sessions.move(a.id, { maxDowntimeMs: a.maxDowntime, targetHostId: Option.getOrUndefined(a.to) }))
          yield* json
            ? printJson(m)
            : print(
                m.downtimeMs === null || m.captureMs === null || m.sendMs === null || m.commitMs === null
                  ? // Committed on a resolution (the target's report that it runs the guest, or an operator's word): no measured pause.
                    `${a.id} moved to ${m.move.targetHostId}: committed on a resolution (its target's report or an operator's word); its pause was not measured`
                  : `${a.id} moved to ${m.move.targetHostId}: paused ${Format.duration(m.downtimeMs)} (capture ${Format.duration(m.captureMs)}, send ${Format.duration(m.sendMs)}, commit ${Format.duration(m.commitMs)}) within ${Format.duration(a.maxDowntime)}`,
              )
        }),
    ).pipe(Command.withDescription("move a running session live to another host within a downtime budget")),
    Command.make(
      "wait",
      {
        id: id("the session"),
        state: Flag.String("state").pipe(Flag.withDescription("the state to wait for")),
        timeout: Flag.String("timeout").pipe(
          Flag.filterMap(
            (t) => Option.fromNullishOr(Format.parseMs(t)),
            () => "a duration above 0: 30s",
          ),
          Flag.withDefault(30_000),
          Flag.withDescription("how long to wait (30s)"),
        ),
      },
      (a) =>
        Effect.gen(function* () {
          const { client, json, target } = yield* context
          const s = yield* call(target, client.sessions.wait(a.id, { state: a.state as Records.SessionState, timeoutMs: a.timeout }))
          yield* json ? printJson(s) : print(`${s.id} is ${s.state}${s.hostId === null ? "" : ` on ${s.hostId}`}`)
        }),
    ).pipe(Command.withDescription("wait until a session reaches a state")),
    Command.make("events", { id: id("the session") }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        // Every page: a long-lived session's history runs past one.
        const items = yield* call(target, client.sessions.eventsAll(a.id))
        if (json) return yield* printJson({ items, nextCursor: null })
        const rows = items.map((e) => [String(e.seq), new Date(e.at).toISOString(), e.kind, ("hostId" in e ? e.hostId : null) ?? "-", Format.details(e)])
        yield* print(rows.length === 0 ? "no events" : Format.table(["SEQ", "AT", "EVENT", "HOST", "DETAILS"], rows))
      }),
    ).pipe(Command.withDescription("what happened to a session, oldest first")),
  ]),
)

/** Where a queued session stands: the coordinator's `queue`, or (older coordinators) the queue's order and a no-fit question. */
const queueOf = (client: EngramClientShape, s: Records.SessionDetail) =>
  Effect.gen(function* () {
    if (s.queue !== undefined && s.queue !== null) return s.queue
    const queued = yield* client.sessions.listAll({ state: "queued" })
    const ordered = [...queued].sort((x, y) => (x.queuedAt ?? 0) - (y.queuedAt ?? 0) || x.id.localeCompare(y.id))
    const nf = yield* client.fleet.noFit(s.budget)
    const hostsNow = yield* client.hosts.listAll()
    const tooBig = hostsNow.length > 0 && hostsNow.filter((h) => h.state === "ready" && h.measured).every((h) => h.allocatableMib !== null && h.allocatableMib < s.budget.memMib)
    return { position: ordered.findIndex((q) => q.id === s.id) + 1, noFit: nf.hosts, tooBig }
  })

const why = Command.make("why", { id: id("the session") }, (a) =>
  Effect.gen(function* () {
    const { client, json, target } = yield* context
    const s = yield* call(target, client.sessions.get(a.id))
    if (s.state !== "queued") {
      const where = s.hostId === null ? "" : ` on ${s.hostId}`
      return yield* json ? printJson({ id: s.id, state: s.state, hostId: s.hostId, queue: null }) : print(`${s.id} is not waiting: it is ${s.state}${where}`)
    }
    const q = yield* call(target, queueOf(client, s))
    if (json) return yield* printJson({ id: s.id, state: s.state, budget: s.budget, queue: q, summary: Why.summarize(q.noFit) })
    const lines = [
      `${s.id} waits at position ${q.position} of the queue for ${Format.age(s.queuedAt, Date.now())}, for ${Format.mib(s.budget.memMib)} and ${Format.vcpus(s.budget.vcpus)}.`,
      `${Why.summarize(q.noFit)}`,
    ]
    if (q.tooBig) lines.push("No host could take it even empty: it waits until a bigger host joins.")
    else {
      // Best effort: the hint is extra, a failed read of the parks leaves it out.
      const parked = yield* Effect.result(client.sessions.listAll({ state: "parked" }))
      const hint = parked._tag === "Success" ? Why.parksHint(s.budget, q.noFit, parked.success) : null
      if (hint !== null) lines.push(hint)
    }
    if (q.noFit.length > 0) {
      lines.push(
        Format.table(
          ["HOST", "REASON", "RAM FREE", "VCPUS FREE", ""],
          [...q.noFit]
            .sort((x, y) => x.reason.localeCompare(y.reason) || x.hostId.localeCompare(y.hostId))
            .map((d) => [d.hostId, d.reason, Format.mib(d.freeMib), d.freeVcpus === null ? "-" : String(d.freeVcpus), Why.meaning[d.reason] ?? ""]),
        ),
      )
    }
    yield* print(lines.join("\n"))
  }),
).pipe(Command.withDescription("why a session waits: its queue position and each host's reason"))

const reservationRows = (all: readonly Records.Reservation[], now: number) =>
  all.map((r) => [
    r.id,
    r.hostId,
    `${r.ownerKind}:${r.ownerId}`,
    Format.mib(r.memMib),
    String(r.vcpus),
    `${Format.age(r.lastHeartbeatAt, now)} ago`,
    r.expiresAt === null ? "-" : r.expiresAt > now ? `in ${Format.duration(r.expiresAt - now)}` : "expired",
  ])
const reservationHeaders = ["RESERVATION", "HOST", "OWNER", "MEM", "VCPUS", "HEARTBEAT", "EXPIRES"]

const reservations = Command.make("reservations").pipe(
  Command.withDescription("the reservation ledger: ls, show, add, rm"),
  Command.withSubcommands([
    Command.make("ls", { host: hostFlag }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        const all = yield* call(target, client.reservations.listAll({ hostId: Option.getOrUndefined(a.host) }))
        if (json) return yield* printJson(all)
        yield* print(all.length === 0 ? "no reservations" : Format.table(reservationHeaders, reservationRows(all, Date.now())))
      }),
    ).pipe(Command.withDescription("every reservation, or one host's")),
    Command.make("show", { id: id("the reservation") }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        const r = yield* call(target, client.reservations.get(a.id))
        yield* json ? printJson(r) : print(Format.table(reservationHeaders, reservationRows([r], Date.now())))
      }),
    ).pipe(Command.withDescription("one reservation")),
    Command.make(
      "add",
      {
        host: Flag.String("host").pipe(Flag.withDescription("the host to hold room on")),
        mem: memFlag,
        vcpus: vcpuFlag,
        owner: Flag.String("owner").pipe(Flag.withDescription("who holds it (your job's name)")),
        id: Flag.String("id").pipe(Flag.optional, Flag.withDescription("your id for it (default: generated)")),
        expires: Flag.String("expires").pipe(
          Flag.filterMap(
            (t) => Option.fromNullishOr(Format.parseMs(t)),
            () => "a duration above 0: 10m, 1h",
          ),
          Flag.optional,
          Flag.withDescription("release it by itself after this long: 10m, 1h (default: held until rm)"),
        ),
      },
      (a) =>
        Effect.gen(function* () {
          const { client, json, target } = yield* context
          // Optional keys are left out, not sent as undefined (the payload schema has exact optional keys).
          const input = {
            hostId: a.host,
            ownerKind: "external" as const,
            ownerId: a.owner,
            memMib: a.mem,
            vcpus: a.vcpus,
            ...Option.match(a.id, { onNone: () => ({}), onSome: (v) => ({ id: v }) }),
            // From now on the coordinator's clock, not this machine's.
            ...Option.match(a.expires, { onNone: () => ({}), onSome: (ms) => ({ expiresInMs: ms }) }),
          }
          const r = yield* call(target, client.reservations.reserve(input))
          const until = r.expiresAt === null ? "until released (engram reservations rm " + r.id + ")" : `for ${Format.duration(Option.getOrElse(a.expires, () => r.expiresAt! - Date.now()))}`
          yield* json ? printJson(r) : print(`${r.id} holds ${Format.mib(r.memMib)} and ${Format.vcpus(r.vcpus)} on ${r.hostId} for ${r.ownerId}, ${until}`)
        }),
    ).pipe(Command.withDescription("hold room on a host for something outside engram (an external reservation)")),
    Command.make("rm", { id: id("the reservation") }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        const r = yield* call(target, client.reservations.release(a.id))
        yield* json ? printJson(r) : print(`${r.id} released: ${Format.mib(r.memMib)} free again on ${r.hostId}`)
      }),
    ).pipe(Command.withDescription("release an external or capture reservation")),
  ]),
)

/** One frame of `watch`: the fleet line, the hosts, the queue. */
const frame = (client: EngramClientShape) =>
  Effect.gen(function* () {
    const [fleet, allHosts, queued, parked] = yield* Effect.all(
      [client.fleet.snapshot(), client.hosts.listAll(), client.sessions.listAll({ state: "queued" }), client.sessions.listAll({ state: "parked" })],
      { concurrency: 4 },
    )
    return { fleet, hosts: allHosts, queue: queued, parks: parked }
  })

const frameText = (f: { fleet: Records.Fleet; hosts: readonly Records.Host[]; queue: readonly Records.Session[]; parks: readonly Records.Session[] }, now: number): string => {
  const q = f.fleet.queue
  const head =
    `engram  ${new Date(now).toTimeString().slice(0, 8)}  hosts ${f.fleet.hosts.ready}/${f.fleet.hosts.total} ready  ` +
    `RAM ${Format.mib(f.fleet.freeMib)} free of ${Format.mib(f.fleet.capacityMib)}  vCPUs ${f.fleet.freeVcpus} free  ` +
    `queue ${q.sessions} (${q.withoutRoom} without room)  parks ${f.fleet.parks}  descents ${f.fleet.descentsRunning}`
  const parts = [head, "", f.hosts.length === 0 ? "no hosts" : Format.table(hostHeaders, hostRows(f.hosts, now))]
  if (f.queue.length > 0) parts.push("", Format.table(["QUEUED", "MEM", "VCPUS", "WAITING"], f.queue.slice(0, 20).map((s) => [s.id, Format.mib(s.budget.memMib), String(s.budget.vcpus), Format.age(s.queuedAt, now)])))
  if (f.parks.length > 0) parts.push("", Format.table(["PARKED", "HOST", "MEM", "FOR"], f.parks.slice(0, 20).map((s) => [s.id, s.hostId ?? "-", Format.mib(s.budget.memMib), Format.age(s.parkedAt, now)])))
  return parts.join("\n")
}

const watch = Command.make(
  "watch",
  {
    interval: Flag.String("interval").pipe(
      Flag.filterMap(
        (t) => Option.fromNullishOr(Format.parseMs(t)),
        () => "a duration above 0: 2s",
      ),
      Flag.withDefault(2000),
      Flag.withDescription("how often to refresh (2s)"),
    ),
    count: wholeFlag("count").pipe(
      Flag.optional,
      Flag.withDescription("stop after this many refreshes (default: until Ctrl-C)"),
    ),
  },
  (a) =>
    Effect.gen(function* () {
      const { client, json, target } = yield* context
      const limit = Option.getOrElse(a.count, () => Number.POSITIVE_INFINITY)
      for (let i = 0; i < limit; i++) {
        if (i > 0) yield* Effect.sleep(a.interval)
        const f = yield* call(target, frame(client))
        if (json) yield* print(JSON.stringify(f))
        // On a terminal the table redraws in place; into a pipe, frames follow each other.
        else yield* print(output.isTTY ? `\u001b[H\u001b[2J${frameText(f, Date.now())}` : `${i > 0 ? "\n" : ""}${frameText(f, Date.now())}`)
      }
    }),
).pipe(Command.withDescription("a live table of the fleet, refreshing until Ctrl-C"))

/**
 * A refused resolution (409) of a move whose source owes a resend: the move is committed already,
 * and the line says what that means (nothing for an operator to commit or abort: the source keeps
 * its copy and streams it again). Any other failure, or a failed read of the move, stays as it was.
 */
const owedRefusal = (client: EngramClientShape, target: Target, id: string, e: CallFailed) =>
  !(e.error instanceof Errors.Conflict)
    ? Effect.fail(e)
    : client.moves.get(id).pipe(
        Effect.matchEffect({
          onFailure: () => Effect.fail(e),
          onSuccess: (m) =>
            Effect.fail(
              m.resendOwed
                ? new CallFailed({
                    error: e.error,
                    message: `${e.message}. Move ${id} is committed and its source owes a resend: it holds the only copy of the guest (paused) and owes ${m.targetHostId} the stream; it streams it again, and should ${m.targetHostId} die the session goes back to ${m.sourceHostId}. Nothing to commit or abort (engram moves show ${id})`,
                  })
                : e,
            ),
        }),
      )

const resolveMove = (outcome: "commit" | "abort", description: string) =>
  Command.make(
    outcome,
    {
      id: id("the move"),
      reason: Flag.String("reason").pipe(Flag.withDescription("why (kept in the log, and on an aborted move)")),
    },
    (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        const m = yield* call(target, client.moves.resolve(a.id, outcome, a.reason)).pipe(Effect.catch((e) => owedRefusal(client, target, a.id, e)))
        yield* json ? printJson(m) : print(`${m.id} ${m.state}: ${m.sessionId} runs on ${m.state === "committed" ? m.targetHostId : m.sourceHostId}`)
      }),
  ).pipe(Command.withDescription(description))

const moves = Command.make("moves").pipe(
  Command.withDescription("live moves: ls, show, commit or abort an in-doubt one"),
  Command.withSubcommands([
    Command.make("ls", { state: Flag.String("state").pipe(Flag.optional, Flag.withDescription("pending, committed or aborted")), host: hostFlag }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        const state = Option.getOrUndefined(a.state) as Records.Move["state"] | undefined
        const all = yield* call(target, client.moves.listAll({ state, hostId: Option.getOrUndefined(a.host) }))
        if (json) return yield* printJson(all)
        const rows = all.map((m) => [
          m.id,
          m.sessionId,
          m.sourceHostId,
          m.targetHostId,
          m.state,
          m.committedBy ?? "-",
          m.state === "pending" && m.rounds.some((r) => r.kind === "final" || r.kind === "intent") ? "in doubt" : "-",
          m.resendOwed ? "owed: source holds the only copy" : "-",
        ])
        yield* print(rows.length === 0 ? "no moves" : Format.table(["MOVE", "SESSION", "FROM", "TO", "STATE", "BY", "FINAL ROUND", "RESEND"], rows))
      }),
    ).pipe(
      Command.withDescription(
        "moves, oldest first, a committed one with who committed it (BY: source, target or operator); an in-doubt one (final round recorded, still pending) is marked, and so is one whose source owes a resend (RESEND: it holds the only copy of the guest and owes the target the stream)",
      ),
    ),
    Command.make("show", { id: id("the move") }, (a) =>
      Effect.gen(function* () {
        const { client, json, target } = yield* context
        const m = yield* call(target, client.moves.get(a.id))
        yield* json ? printJson(m) : print(moveText(m))
      }),
    ).pipe(
      Command.withDescription(
        "one move: its pause by phase, the commit allowance and estimate its guard used, with their errors, and whether its source owes a resend (it holds the only copy of the guest and owes the target the stream)",
      ),
    ),
    resolveMove(
      "commit",
      "an in-doubt move: the guest runs on the target (say so only when its target runs it). If the target holds no complete stream, the source keeps its copy paused and marks the move: resend owed (moves show, moves ls), streaming it again; should the target die while that mark is set (the source sets it again whenever the target answers that it runs nothing), the session goes back to the source",
    ),
    resolveMove("abort", "an in-doubt move: the guest runs on the source; the target's copy is destroyed. A committed move (one whose source owes a resend too) is refused"),
  ]),
)

/** The whole command line. */
export const command = engram.pipe(Command.withSubcommands([status, hosts, sessions, why, reservations, moves, watch]))

/** A negative figure with a unit (`-1GiB`, `-5m`): effect/cli's lexer reads it as short flags (only a bare number is a value). */
const negativeWithUnit = /^-[0-9.]+[A-Za-z]+$/

/**
 * pnpm passes `--` through (`pnpm engram -- status`): it is not an argument. A long flag followed
 * by a negative figure with a unit (`--mem -1GiB`) is joined as `--mem=-1GiB`, so the flag's own
 * rule answers ("Invalid value for flag --mem: "-1GiB". Expected: a RAM size above 0…") instead
 * of "Missing value for flag --mem" (no flag of engram is a digit).
 */
export const args = (argv: readonly string[]): string[] => {
  const given = argv[0] === "--" ? argv.slice(1) : [...argv]
  const out: string[] = []
  for (let i = 0; i < given.length; i++) {
    const arg = given[i]!
    const next = given[i + 1]
    if (arg === "--") return [...out, ...given.slice(i)]
    if (arg.startsWith("--") && !arg.includes("=") && next !== undefined && negativeWithUnit.test(next)) {
      out.push(`${arg}=${next}`)
      i++
    } else out.push(arg)
  }
  return out
}

/**
 * Help as effect/cli shows it; a wrong invocation as one line on stderr naming the flag or
 * argument and the rule, and where the help is (`engram sessions create --help`).
 */
export const presenter: CliOutput.Presenter = {
  present: (event) =>
    event._tag === "InvalidInvocation"
      ? Effect.sync(() => {
          const first = event.errors[0]
          const text = (first?.message ?? "invalid command line").replace(/\s*\n\s*/g, " ")
          process.stderr.write(`engram: ${text} (see: ${event.commandPath.join(" ")} --help)\n`)
        })
      : CliOutput.defaultPresenter.present(event),
}

/** Runs a command line with `out` as its output. */
export const run = (argv: readonly string[], out: Output = stdout) => {
  output = out
  return Command.runWith(command, { version })(args(argv)).pipe(Effect.provide(CliOutput.layerPresenter(presenter)))
}
