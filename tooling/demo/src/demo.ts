/**
 * The demo fleet beside a coordinator: registers two simulated hosts, runs their agents in
 * this process (simulated runtimes, fixed host sizes, never this machine's RAM), and unless
 * `ENGRAM_DEMO_TOUR=0` tells a short numbered story so a new user sees sessions place, park,
 * descend and move, then a closing block with the CLI commands and the dashboard's address.
 * `pnpm start` at the repository root runs it next to the coordinator (tooling/scripts/start.mjs).
 * With `ENGRAM_RUNTIME=qemu` and no guest of the user's (`ENGRAM_QEMU_KERNEL`/`ENGRAM_QEMU_DISK`),
 * the agents boot the repository's test guest (`tooling/guest`), built here on first use.
 *
 * Environment: `ENGRAM_COORDINATOR_URL` (default `http://127.0.0.1:${ENGRAM_PORT ?? 7070}`),
 * `ENGRAM_ADMIN_TOKEN` or `ENGRAM_ADMIN_TOKEN_FILE` (default `<data dir>/admin-token`, the file
 * the coordinator generates), `ENGRAM_DEMO_STATE_DIR` (default `<data dir>/demo`),
 * `ENGRAM_DEMO_TOUR` (unset: the tour runs once per data dir; `1`: on every start; `0`: never;
 * in every case only on a fleet nobody uses), `ENGRAM_TOUR_VERBOSE=1` (the agents' own lines: every
 * pre-copy round of a move, each VM started or parked). The data dir is the coordinator's:
 * `ENGRAM_DATA_DIR`, default `./.engram`, a relative path taken from the directory pnpm was
 * run from (`INIT_CWD`), so `pnpm start` at the repository root uses the root's `.engram/`.
 *
 * The tour leaves a fleet in use alone: it cordons a host and makes a park descend, so it runs
 * only while no session or reservation holds room, nothing waits, and the fleet has only the
 * demo's two hosts, both ready. On SIGINT/SIGTERM the demo ends the sessions that hold room on
 * its hosts before its agents stop (their VMs stop with them; left alone, the sessions would
 * turn `lost` once their reservations went stale).
 *
 * Secrets never reach the output: the admin token, the host tokens and the peer secret stay
 * in their files (mode 0600), and printed commands read them with `$(cat <file>)`.
 */
import { randomBytes } from "node:crypto"
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs"
import { isAbsolute, join, relative, resolve } from "node:path"
import { Errors, make as makeClient } from "@engram/client"
import type { EngramClientShape, Records } from "@engram/client"
import { Config, Measure, MoveToken, startHostAgent } from "@engram/host-agent"
import { Fatal, Log, Main } from "@engram/process"
import { Effect, References } from "effect"
import type { LogLevel } from "effect"
import { FetchHttpClient } from "effect/http"
import { guestEnvironment } from "./Guest.js"
import { cliCommand, cliSettings } from "./Hints.js"

const env = process.env
const set = (name: string) => (env[name] === undefined || env[name] === "" ? undefined : env[name])
// The agents' variable may list several replicas: the demo talks to the first.
const coordinatorUrl = (set("ENGRAM_COORDINATOR_URL")?.split(",")[0]?.trim() || `http://127.0.0.1:${set("ENGRAM_PORT") ?? "7070"}`).replace(/\/+$/, "")
/**
 * A path as the user meant it: relative to the directory pnpm was run from (`INIT_CWD`; pnpm
 * runs the script itself in apps/host-agent), else to the working directory. The coordinator
 * resolves `ENGRAM_DATA_DIR` the same way (its Config.resolveDataDir).
 */
const invocationDir = env["INIT_CWD"] || process.cwd()
const fromInvocationDir = (p: string) => (isAbsolute(p) ? p : resolve(invocationDir, p))
/** A path for a person to read: relative to where they started when it is below it. */
const shown = (p: string) => {
  const r = relative(invocationDir, p)
  return r !== "" && !r.startsWith("..") && !isAbsolute(r) ? r : p
}
const dataDir = fromInvocationDir(set("ENGRAM_DATA_DIR") ?? "./.engram")
const adminFromEnv = set("ENGRAM_ADMIN_TOKEN")
const tokenFile = fromInvocationDir(set("ENGRAM_ADMIN_TOKEN_FILE") ?? join(dataDir, "admin-token"))
const stateDir = fromInvocationDir(set("ENGRAM_DEMO_STATE_DIR") ?? join(dataDir, "demo"))
const tourSetting = env["ENGRAM_DEMO_TOUR"]
const verbose = env["ENGRAM_TOUR_VERBOSE"] === "1" || env["ENGRAM_TOUR_VERBOSE"] === "true"
const logSettings = Log.settingsOfProcess().settings

/** The two simulated hosts: fixed sizes so the demo looks the same on every machine. */
const hosts = [
  { id: "sim-host-1", totalMib: 8192, osMib: 512, vcpus: 8 },
  { id: "sim-host-2", totalMib: 4096, osMib: 512, vcpus: 4 },
] as const

/**
 * The template both demo agents hold (built in the background as they start): the tour's 1 GiB
 * sessions start from it instead of booting. Simulated, a template start is a shorter wait; on
 * QEMU it is the booted guest's devices and RAM file, the RAM copied sparsely and mapped.
 */
const template = { name: "demo-1g", memMib: 1024, vcpus: 1 } as const

/**
 * One line of the story: plain text on a terminal (the story is the output), an info event
 * with its fields in JSON mode.
 */
const say = (text: string, fields: Record<string, unknown> = {}) =>
  logSettings.format === "pretty"
    ? Effect.sync(() => void process.stdout.write(`${text}\n`))
    : text.trim() === ""
      ? Effect.void
      : Effect.logInfo(text.trim(), fields)

const gib = (mib: number) => (mib % 1024 === 0 ? `${mib / 1024} GiB` : `${(mib / 1024).toFixed(1)} GiB`)

/** Waits for the coordinator to answer and for its admin token. */
const waitForCoordinator = Effect.gen(function* () {
  for (let i = 0; ; i++) {
    const up = yield* Effect.tryPromise(() => fetch(`${coordinatorUrl}/livez`).then((r) => r.ok)).pipe(Effect.orElseSucceed(() => false))
    const token = adminFromEnv ?? (existsSync(tokenFile) ? readFileSync(tokenFile, "utf8").trim() : "")
    if (up && token.length >= 16) return token
    // Once after a few seconds (a first start sets up the embedded database), then every 30 s.
    if (i % 60 === 6) {
      yield* Effect.logInfo(
        `demo: waiting for the coordinator at ${coordinatorUrl} and its admin token (${adminFromEnv !== undefined ? "ENGRAM_ADMIN_TOKEN" : shown(tokenFile)}); a first start sets up its database, which can take a minute`,
      )
    }
    yield* Effect.sleep(500)
  }
})

/** Registers a host, or reuses the token this demo saved for it on an earlier run. */
const register = (engram: EngramClientShape, id: string, saved: Record<string, string>) =>
  Effect.gen(function* () {
    const created = yield* Effect.result(engram.hosts.create({ id, labels: { demo: "true" } }))
    if (created._tag === "Success") return { id, token: created.success.token }
    const known = saved[id]
    if (created.failure instanceof Errors.Conflict && known !== undefined) return { id, token: known }
    if (!(created.failure instanceof Errors.Conflict)) return yield* Effect.fail(created.failure)
    // Registered by someone else (or this demo's tokens were lost): use a fresh id.
    const fresh = `${id}-${randomBytes(3).toString("hex")}`
    const again = yield* engram.hosts.create({ id: fresh, labels: { demo: "true" } })
    return { id: fresh, token: again.token }
  })

/** Polls a session until it is in `state` (or 30 s pass) and answers it. */
const waitFor = (engram: EngramClientShape, id: string, state: Records.SessionState) =>
  Effect.gen(function* () {
    for (let i = 0; i < 120; i++) {
      const s = yield* engram.sessions.get(id)
      if (s.state === state) return s
      yield* Effect.sleep(250)
    }
    return yield* engram.sessions.get(id)
  })

/** The short walk through the life of a few sessions. */
const runTour = (engram: EngramClientShape, hostIds: readonly string[]) =>
  Effect.gen(function* () {
    const run = Date.now().toString(36)
    const id = (n: string) => `tour-${run}-${n}`
    const [big, small] = hostIds as [string, string]
    yield* say("")
    yield* say(`The tour: two simulated hosts, ${big} (8 GiB, 8 vCPUs) and ${small} (4 GiB, 4 vCPUs).`)
    const bigHost = yield* engram.hosts.get(big)
    for (const line of roomLines(bigHost, hosts[0])) yield* say(line)

    const a = yield* engram.sessions.create({ id: id("a"), memMib: 1024, vcpus: 1, affinity: [small], template: template.name })
    const aRunning = yield* waitFor(engram, id("a"), "running")
    yield* say(
      `  1. A session of 1 GiB is created from the template ${template.name}: placed on ${aRunning.hostId ?? "?"}, where its agent starts the VM from that booted, paused guest instead of booting one (${aRunning.state}).`,
      { session: a.id, hostId: aRunning.hostId, template: template.name },
    )

    yield* engram.sessions.idle(id("a"))
    const parked = yield* waitFor(engram, id("a"), "parked")
    yield* say(`  2. It goes idle. Nothing waits for room, so it ${parked.state === "parked" ? "parks: paused in RAM, keeping its room, ready to resume in milliseconds" : `is ${parked.state}`}.`, { session: a.id, state: parked.state })

    yield* engram.hosts.cordon(big)
    yield* engram.sessions.create({ id: id("b"), memMib: 1536, vcpus: 1, affinity: [small] })
    const c = yield* engram.sessions.create({ id: id("c"), memMib: 1024, vcpus: 1, template: template.name })
    const why = c.outcome === "queued" ? c.noFit.map((d) => `${d.hostId} ${d.reason}`).join(", ") : "it placed at once"
    yield* say(`  3. ${big} is cordoned and ${small} filled; a new 1 GiB session finds no room and queues (${why}).`, { session: c.id, outcome: c.outcome })
    const descended = yield* waitFor(engram, id("a"), "descended")
    const cRunning = yield* waitFor(engram, id("c"), "running")
    yield* say(`     The park yields: session a ${descended.state} (captured to disk, room released), and the queued session runs on ${cRunning.hostId ?? "?"}.`, {
      parked: a.id,
      parkedState: descended.state,
      queued: c.id,
      state: cRunning.state,
    })
    yield* engram.hosts.uncordon(big)

    const moved = yield* Effect.result(engram.sessions.move(id("c"), { targetHostId: big, maxDowntimeMs: 700 }))
    if (moved._tag === "Success") {
      const m = moved.success
      if (m.downtimeMs === null || m.captureMs === null || m.sendMs === null || m.commitMs === null) {
        // Committed on a resolution (the target's report that it runs the guest, or an operator's word): the pause was not measured.
        yield* say(`  4. It moves live to ${big}, committed on a resolution (its target's report or an operator's word; its pause not measured).`, { moveId: m.move.id, phases: null })
      } else {
        // Said as measured: the guard decides on estimates, and a loaded machine can pause longer.
        const within = m.downtimeMs <= 700 ? "within its 700 ms downtime budget" : "but over its 700 ms downtime budget (the estimates missed: a loaded machine)"
        yield* say(
          `  4. It moves live to ${big} ${within}: paused ${Math.round(m.downtimeMs)} ms (capture ${Math.round(m.captureMs)}, send ${Math.round(m.sendMs)}, commit ${Math.round(m.commitMs)} ms).`,
          { downtimeMs: m.downtimeMs, captureMs: m.captureMs, sendMs: m.sendMs, commitMs: m.commitMs },
        )
      }
    } else yield* say(`  4. The move to ${big} did not commit: ${Errors.describe(moved.failure)}`, { error: moved.failure.code })

    const back = yield* Effect.result(engram.sessions.move(id("c"), { targetHostId: small, maxDowntimeMs: 300 }))
    if (back._tag === "Failure" && back.failure instanceof Errors.MoveDowntime) {
      const e = back.failure
      yield* say(`  5. Moving it back within 300 ms is refused before the guest pauses (estimate ${Math.round(e.estimateMs ?? 0)} ms): it keeps running where it is.`, {
        estimateMs: e.estimateMs,
        maxDowntimeMs: e.maxDowntimeMs,
      })
    } else yield* say(`  5. Moving it back within 300 ms: ${back._tag === "Success" ? "it committed (a fast machine)" : Errors.describe(back.failure)}.`)

    for (const n of ["a", "b", "c"]) yield* Effect.ignore(engram.sessions.end(id(n)))
    yield* say("  6. The tour ends its sessions.")
  })

/**
 * Why a host offers less RAM and more vCPUs than it has, in one line each, from the figures the
 * coordinator answers (its capacity after the system reserve, its CPU budget after overcommit).
 */
const roomLines = (h: Records.Host, size: { readonly totalMib: number; readonly vcpus: number }): string[] => {
  const lines: string[] = []
  if (h.allocatableMib !== null && h.reportedAllocatableMib !== null) {
    const osMib = size.totalMib - h.reportedAllocatableMib
    const reserveMib = h.reportedAllocatableMib - h.allocatableMib
    lines.push(
      `   Reserve: of ${h.id}'s ${gib(size.totalMib)}, its OS uses ${gib(osMib)} and the coordinator keeps ${gib(reserveMib)} for the host itself (ENGRAM_SYSTEM_RESERVE_MIB), so sessions get ${gib(h.allocatableMib)}.`,
    )
  }
  if (h.cpuBudget !== null && h.cpuBudget > size.vcpus) {
    lines.push(
      `   Overcommit: sessions rarely keep every vCPU busy, so each core counts ${h.cpuBudget / size.vcpus} times (ENGRAM_CPU_OVERCOMMIT): its ${size.vcpus} cores offer ${h.cpuBudget} vCPUs. RAM is not overcommitted.`,
    )
  }
  return lines
}

/** Why the tour would touch someone's fleet: null when the fleet is the demo's own and unused. */
const inUse = (engram: EngramClientShape, demoHosts: readonly string[]) =>
  Effect.gen(function* () {
    const [all, fleet] = yield* Effect.all([engram.hosts.listAll(), engram.fleet.snapshot()])
    const others = all.filter((h) => !demoHosts.includes(h.id)).map((h) => h.id)
    const held = all.reduce((n, h) => n + h.entries, 0)
    const notReady = all.filter((h) => demoHosts.includes(h.id) && h.state !== "ready").map((h) => `${h.id} ${h.state}`)
    const reasons = [
      held > 0 ? (held === 1 ? "1 session or reservation holds room" : `${held} sessions or reservations hold room`) : null,
      fleet.queue.sessions > 0 ? `${fleet.queue.sessions} queued` : null,
      others.length > 0 ? `hosts besides the demo's: ${others.slice(0, 3).join(", ")}${others.length > 3 ? ", …" : ""}` : null,
      notReady.length > 0 ? notReady.join(", ") : null,
    ].filter((r): r is string => r !== null)
    return reasons.length === 0 ? null : reasons.join("; ")
  })

/** Sessions in these states hold room on a host: left behind by stopped agents they would turn `lost`. */
const holdingRoom: ReadonlySet<Records.SessionState> = new Set(["pending", "running", "parked", "descending", "moving"])

/** Ends the sessions that hold room on the demo's hosts (at Ctrl-C, while the agents still run). */
const endDemoSessions = (engram: EngramClientShape, demoHosts: readonly string[]) =>
  Effect.gen(function* () {
    const ended: string[] = []
    for (const hostId of demoHosts) {
      const sessions = yield* engram.sessions.listAll({ hostId })
      for (const s of sessions) {
        if (!holdingRoom.has(s.state)) continue
        yield* engram.sessions.end(s.id)
        ended.push(s.id)
      }
    }
    if (ended.length > 0) {
      yield* say(`Stopping: ended ${ended.length} session${ended.length === 1 ? "" : "s"} on the demo hosts (${ended.slice(0, 5).join(", ")}${ended.length > 5 ? ", …" : ""}); their VMs stop with the agents.`, {
        ended,
      })
    }
  }).pipe(
    Effect.timeout(10_000),
    Effect.catch((e) =>
      Effect.logWarning(
        `demo: could not end the sessions on the demo hosts (${e instanceof Error ? e.message : String(e)}); they turn lost once their reservations go stale`,
      ),
    ),
  )

/** What `pnpm engram` needs set in another terminal to find this coordinator and its token (none on the defaults). */
const cliNeeds = () =>
  cliSettings({ coordinatorUrl, tokenFile: shown(tokenFile), cliTokenFile: shown(resolve(invocationDir, ".engram", "admin-token")), adminFromEnv: adminFromEnv !== undefined })

const closing = () => {
  const bearer = adminFromEnv !== undefined ? "$ENGRAM_ADMIN_TOKEN" : `$(cat ${shown(tokenFile)})`
  const tokenWhere = adminFromEnv !== undefined ? "ENGRAM_ADMIN_TOKEN" : shown(tokenFile)
  const needs = cliNeeds()
  return [
    "",
    "Try it yourself (in another terminal, at the repository root):",
    ...(needs.length === 0 ? [] : [`  export ${needs.join(" ")}   (not the CLI's defaults: say where the coordinator and its token are)`]),
    "  pnpm engram -- status                           the fleet signal",
    "  pnpm engram -- hosts ls                         hosts and their room",
    "  pnpm engram -- sessions create --mem 1GiB --vcpus 1",
    "  pnpm engram -- sessions ls                      sessions and their states",
    "  pnpm engram -- watch                            a live table",
    `  dashboard      ${coordinatorUrl}/ui   (sign in with the token in ${tokenWhere})`,
    `  API reference  ${coordinatorUrl}/docs`,
    `  curl -s -H "authorization: Bearer ${bearer}" ${coordinatorUrl}/v1/fleet`,
    "Ctrl-C ends the sessions on the demo hosts and stops the coordinator and the agents.",
  ]
}

const program = Effect.gen(function* () {
  const admin = yield* waitForCoordinator
  const engram = yield* makeClient({ baseUrl: coordinatorUrl, token: admin }).pipe(Effect.provide(FetchHttpClient.layer))
  // The admin token must be the coordinator's: a stale file is a clear stop, not a tour of errors.
  yield* engram.fleet.snapshot().pipe(
    Effect.catchTag("Unauthorized", () =>
      Effect.fail(new Fatal({ message: `the coordinator at ${coordinatorUrl} refused the admin token from ${adminFromEnv !== undefined ? "ENGRAM_ADMIN_TOKEN" : tokenFile}`, exitCode: Main.exitCodes.credential })),
    ),
  )
  mkdirSync(stateDir, { recursive: true, mode: 0o700 })
  const savedFile = join(stateDir, "hosts.json")
  const saved = (existsSync(savedFile) ? JSON.parse(readFileSync(savedFile, "utf8")) : {}) as Record<string, string>
  const secretFile = join(stateDir, "peer-secret")
  if (!existsSync(secretFile)) writeFileSync(secretFile, randomBytes(24).toString("hex"), { mode: 0o600 })
  const peerSecret = readFileSync(secretFile, "utf8").trim()

  const registered = []
  for (const h of hosts) registered.push({ ...h, ...(yield* register(engram, h.id, saved)) })
  writeFileSync(savedFile, JSON.stringify(Object.fromEntries(registered.map((r) => [r.id, r.token])), null, 2), { mode: 0o600 })

  // The agents' own lines (each VM started, every pre-copy round) only when asked for.
  const agentLevel: LogLevel.LogLevel = verbose || set("ENGRAM_LOG_LEVEL") !== undefined ? logSettings.level : "Warn"
  const urls = new Map<string, string>()
  const kinds = new Set<string>()
  const runtimeEnv = yield* guestEnvironment(env)
  for (const h of registered) {
    const stateFile = join(stateDir, `${h.id}.state.json`)
    // ENGRAM_RUNTIME=qemu: real guests (README "Real guests"); the simulated runtime otherwise.
    const runtime = yield* Config.runtimeFromEnvironment(runtimeEnv, h.id, stateFile).pipe(Effect.tapError((e) => Effect.logError(e.message)))
    const agent = yield* startHostAgent({
      ...runtime,
      hostId: h.id,
      coordinator: { url: coordinatorUrl, hostToken: h.token },
      peerSecret,
      peers: (id) => urls.get(id),
      listen: { port: 0, host: "127.0.0.1" },
      stateFile,
      imageDir: join(stateDir, `${h.id}-images`),
      measure: (mib) => Measure.HostMeter.use((m) => m.measure(mib)).pipe(Effect.provide(Measure.layerFixed({ totalMib: h.totalMib, osMib: h.osMib, vcpus: h.vcpus }))),
      config: { pollWaitMs: 10_000, reportIntervalMs: 10_000, templates: [template] },
    }).pipe(Effect.provideService(References.MinimumLogLevel, agentLevel))
    // The demo's real guests end with it (a production agent leaves its VMs running across its
    // restarts: they outlive it by design). Run before the agent's scope closes its QMP links.
    if (agent.runtimeInfo.kind === "qemu") {
      yield* Effect.addFinalizer(() =>
        Effect.flatMap(agent.runtime.list, (vms) => Effect.forEach(vms, (vm) => agent.runtime.destroy(vm.vmId), { concurrency: "unbounded", discard: true })),
      )
    }
    urls.set(h.id, `http://127.0.0.1:${agent.port}`)
    // The status bearer derives from the peer secret: it goes to a 0600 file, never to the output.
    const statusFile = join(stateDir, `${h.id}.status-token`)
    writeFileSync(statusFile, `${MoveToken.statusToken(peerSecret, h.id)}\n`, { mode: 0o600 })
    chmodSync(statusFile, 0o600)
    const status = `curl -s ${urls.get(h.id)}/v1/peer/status -H "authorization: Bearer $(cat ${statusFile})"`
    kinds.add(agent.runtimeInfo.kind === "sim" ? "simulated" : `${agent.runtimeInfo.kind} guests under ${agent.runtimeInfo.accelerator}`)
    if (verbose) yield* Effect.logInfo(`demo: ${h.id} (${gib(h.totalMib)}, ${h.vcpus} vCPUs, ${[...kinds].at(-1)}) agent on ${urls.get(h.id)}`, { status })
    else yield* Effect.logDebug(`demo: ${h.id} agent on ${urls.get(h.id)}`, { status })
  }
  yield* say(`engram demo: coordinator ${coordinatorUrl}, hosts ${registered.map((r) => r.id).join(" and ")} (${[...kinds].join(", ")}), state in ${shown(stateDir)}`)
  const demoHosts = registered.map((r) => r.id)
  // Added after the agents started, so it runs before they stop.
  yield* Effect.addFinalizer(() => endDemoSessions(engram, demoHosts))
  const touredFile = join(stateDir, "toured")
  if (tourSetting === "0") {
    // No tour asked for.
  } else if (tourSetting !== "1" && existsSync(touredFile)) {
    yield* say("The tour ran on an earlier start (ENGRAM_DEMO_TOUR=1 shows it again).")
  } else {
    // Let the agents' first reports land, so both hosts take placements.
    yield* Effect.sleep(1500)
    const busy = yield* inUse(engram, demoHosts)
    if (busy !== null) {
      yield* say(
        `The tour is skipped: this fleet is in use (${busy}), and the tour would cordon a host and make a park descend. ENGRAM_DATA_DIR=.engram-tour pnpm start gives it a fleet of its own.`,
        { inUse: busy },
      )
    } else {
      yield* runTour(engram, demoHosts).pipe(
        Effect.andThen(Effect.sync(() => writeFileSync(touredFile, `${new Date().toISOString()}\n`))),
        Effect.catch((e: Errors.ClientError) => Effect.logWarning(`the tour stopped: ${Errors.describe(e)}`)),
      )
    }
  }
  if (logSettings.format === "pretty") for (const line of closing()) yield* say(line)
  else yield* Effect.logInfo("demo ready: try the CLI, the dashboard and the API", { cli: cliCommand(cliNeeds(), "status"), dashboard: `${coordinatorUrl}/ui`, docs: `${coordinatorUrl}/docs` })
  return yield* Effect.never
})

Main.run(Effect.scoped(program), { name: "engram demo" })
