/**
 * The demo fleet beside a coordinator: registers two simulated hosts, runs their agents in
 * this process (simulated runtimes, fixed host sizes, never this machine's RAM), and unless
 * `ENGRAM_DEMO_TOUR=0` walks a short tour so a new user sees sessions place, park, descend
 * and move. `pnpm start` at the repository root runs it next to the coordinator.
 *
 * Environment: `ENGRAM_COORDINATOR_URL` (default `http://127.0.0.1:${ENGRAM_PORT ?? 7070}`),
 * `ENGRAM_ADMIN_TOKEN` or `ENGRAM_ADMIN_TOKEN_FILE` (default `<data dir>/admin-token`, the file
 * the coordinator generates), `ENGRAM_DEMO_STATE_DIR` (default `<data dir>/demo`),
 * `ENGRAM_DEMO_TOUR` (`0` = no tour). The data dir is the coordinator's: `ENGRAM_DATA_DIR`,
 * default `./.engram`, a relative path taken from the directory pnpm was run from (`INIT_CWD`),
 * so `pnpm start` at the repository root uses the root's `.engram/` for both.
 *
 * Secrets never reach the output: the admin token, the host tokens and the peer secret stay
 * in their files (mode 0600), and the printed `curl` lines read them with `$(cat <file>)`.
 */
import { randomBytes } from "node:crypto"
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs"
import { isAbsolute, join, resolve } from "node:path"
import { NodeRuntime } from "@effect/platform-node"
import { Effect, Logger } from "effect"
import { runtimeFromEnvironment } from "./Config.js"
import { startHostAgent } from "./Host.js"
import { layerFixed, HostMeter } from "./Measure.js"
import { statusToken } from "./MoveToken.js"

const env = process.env
const coordinatorUrl = (env["ENGRAM_COORDINATOR_URL"] ?? `http://127.0.0.1:${env["ENGRAM_PORT"] ?? "7070"}`).replace(/\/+$/, "")
/**
 * A path as the user meant it: relative to the directory pnpm was run from (`INIT_CWD`; pnpm
 * runs the script itself in apps/host-agent), else to the working directory. The coordinator
 * resolves `ENGRAM_DATA_DIR` the same way (its Config.resolveDataDir).
 */
const fromInvocationDir = (p: string) => (isAbsolute(p) ? p : resolve(env["INIT_CWD"] || process.cwd(), p))
const set = (name: string) => (env[name] === undefined || env[name] === "" ? undefined : env[name])
const dataDir = fromInvocationDir(set("ENGRAM_DATA_DIR") ?? "./.engram")
const adminFromEnv = set("ENGRAM_ADMIN_TOKEN")
const tokenFile = fromInvocationDir(set("ENGRAM_ADMIN_TOKEN_FILE") ?? join(dataDir, "admin-token"))
/** How a printed command gets the admin token: never the token itself. */
const adminBearer = adminFromEnv !== undefined ? "$ENGRAM_ADMIN_TOKEN" : `$(cat ${tokenFile})`
const stateDir = fromInvocationDir(set("ENGRAM_DEMO_STATE_DIR") ?? join(dataDir, "demo"))
const tour = env["ENGRAM_DEMO_TOUR"] !== "0"

/** The two simulated hosts: fixed sizes so the demo looks the same on every machine. */
const hosts = [
  { id: "sim-host-1", totalMib: 8192, osMib: 512, vcpus: 8 },
  { id: "sim-host-2", totalMib: 4096, osMib: 512, vcpus: 4 },
] as const

const sleep = (ms: number) => Effect.sleep(ms)

const request = (token: string, method: string, path: string, body?: unknown) =>
  Effect.tryPromise(async () => {
    const res = await fetch(`${coordinatorUrl}${path}`, {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    })
    const text = await res.text()
    return { status: res.status, body: (text === "" ? null : JSON.parse(text)) as Record<string, unknown> | null }
  })

/** Waits for the coordinator to answer and for its admin token. */
const waitForCoordinator = Effect.gen(function* () {
  for (let i = 0; ; i++) {
    const up = yield* Effect.tryPromise(() => fetch(`${coordinatorUrl}/healthz`).then((r) => r.ok)).pipe(Effect.orElseSucceed(() => false))
    const token = adminFromEnv ?? (existsSync(tokenFile) ? readFileSync(tokenFile, "utf8").trim() : "")
    if (up && token.length >= 16) return token
    if (i % 10 === 0) yield* Effect.logInfo(`demo: waiting for the coordinator at ${coordinatorUrl} (admin token from ${adminFromEnv !== undefined ? "ENGRAM_ADMIN_TOKEN" : tokenFile})`)
    yield* sleep(500)
  }
})

/** Registers a host, or reuses the token this demo saved for it on an earlier run. */
const register = (admin: string, id: string, saved: Record<string, string>) =>
  Effect.gen(function* () {
    const created = yield* request(admin, "POST", "/v1/hosts", { id, labels: { demo: "true" } })
    if (created.status === 201 && typeof created.body?.["token"] === "string") return { id, token: created.body["token"] }
    const known = saved[id]
    if (created.status === 409 && known !== undefined) return { id, token: known }
    // Registered by someone else (or this demo's tokens were lost): use a fresh id.
    const fresh = `${id}-${randomBytes(3).toString("hex")}`
    const again = yield* request(admin, "POST", "/v1/hosts", { id: fresh, labels: { demo: "true" } })
    if (again.status !== 201 || typeof again.body?.["token"] !== "string") return yield* Effect.fail(new Error(`cannot register ${fresh}: ${again.status} ${JSON.stringify(again.body)}`))
    return { id: fresh, token: again.body["token"] }
  })

const sessionState = (admin: string, id: string) =>
  Effect.map(request(admin, "GET", `/v1/sessions/${id}`), (r) => ({ state: String(r.body?.["state"]), hostId: r.body?.["hostId"] }))

const waitFor = (admin: string, id: string, state: string) =>
  Effect.gen(function* () {
    for (let i = 0; i < 120; i++) {
      const s = yield* sessionState(admin, id)
      if (s.state === state) return s
      yield* sleep(250)
    }
    return yield* sessionState(admin, id)
  })

/** A short walk through the life of a few sessions; every step is logged. */
const runTour = (admin: string, hostIds: readonly string[]) =>
  Effect.gen(function* () {
    const say = (msg: string, fields: Record<string, unknown> = {}) => Effect.logInfo(`tour: ${msg}`, fields)
    const run = Date.now().toString(36)
    const id = (n: string) => `tour-${run}-${n}`
    const [big, small] = hostIds as [string, string]
    yield* say("1. create a session: it places on the best-fitting host and its agent starts the VM")
    const a = yield* request(admin, "POST", "/v1/sessions", { id: id("a"), memMib: 1024, vcpus: 1, affinity: [small] })
    yield* say("placed", { status: a.status, ...a.body })
    yield* say("running", { session: id("a"), ...(yield* waitFor(admin, id("a"), "running")) })

    yield* say("2. the session goes idle: with nothing waiting it parks (paused in RAM, keeps its reservation)")
    yield* request(admin, "POST", `/v1/sessions/${id("a")}/idle`)
    yield* say("parked", { session: id("a"), ...(yield* waitFor(admin, id("a"), "parked")) })

    yield* say(`3. fill ${small} and queue one more: the park descends to make room, then the queued session places`)
    yield* request(admin, "POST", `/v1/hosts/${big}/cordon`)
    const fill = yield* request(admin, "POST", "/v1/sessions", { id: id("b"), memMib: 1536, vcpus: 1, affinity: [small] })
    yield* say("filler", { status: fill.status, ...fill.body })
    const queued = yield* request(admin, "POST", "/v1/sessions", { id: id("c"), memMib: 1024, vcpus: 1 })
    yield* say("queued (no room anywhere)", { status: queued.status, ...queued.body })
    yield* say("descended", { session: id("a"), ...(yield* waitFor(admin, id("a"), "descended")) })
    yield* say("the queued session placed and runs", { session: id("c"), ...(yield* waitFor(admin, id("c"), "running")) })
    yield* request(admin, "POST", `/v1/hosts/${big}/uncordon`)

    yield* say(`4. live-move ${id("c")} to ${big} with a 700 ms downtime budget`)
    const moved = yield* request(admin, "POST", `/v1/sessions/${id("c")}/move`, { targetHostId: big, maxDowntimeMs: 700 })
    const { move: _move, ...figures } = moved.body ?? {}
    yield* say("move answered", { status: moved.status, ...figures })
    yield* say(`5. the same move back with a 300 ms budget: the guard refuses it before pausing the guest`)
    const refused = yield* request(admin, "POST", `/v1/sessions/${id("c")}/move`, { targetHostId: small, maxDowntimeMs: 300 })
    yield* say("move answered", { status: refused.status, ...refused.body })

    for (const n of ["a", "b", "c"]) yield* request(admin, "DELETE", `/v1/sessions/${id(n)}`)
    yield* say("done: the tour's sessions are ended. Try the API yourself, e.g.", {
      create: `curl -s -X POST ${coordinatorUrl}/v1/sessions -H "authorization: Bearer ${adminBearer}" -H 'content-type: application/json' -d '{"memMib":512,"vcpus":1}'`,
    })
  })

const program = Effect.gen(function* () {
  const admin = yield* waitForCoordinator
  yield* Effect.logInfo(`demo: coordinator at ${coordinatorUrl}; admin token ${adminFromEnv !== undefined ? "from ENGRAM_ADMIN_TOKEN" : `in ${tokenFile}`}; demo state in ${stateDir}`)
  mkdirSync(stateDir, { recursive: true, mode: 0o700 })
  const savedFile = join(stateDir, "hosts.json")
  const saved = (existsSync(savedFile) ? JSON.parse(readFileSync(savedFile, "utf8")) : {}) as Record<string, string>
  const secretFile = join(stateDir, "peer-secret")
  if (!existsSync(secretFile)) writeFileSync(secretFile, randomBytes(24).toString("hex"), { mode: 0o600 })
  const peerSecret = readFileSync(secretFile, "utf8").trim()

  const registered = []
  for (const h of hosts) registered.push({ ...h, ...(yield* register(admin, h.id, saved)) })
  writeFileSync(savedFile, JSON.stringify(Object.fromEntries(registered.map((r) => [r.id, r.token])), null, 2), { mode: 0o600 })

  const urls = new Map<string, string>()
  for (const h of registered) {
    const stateFile = join(stateDir, `${h.id}.state.json`)
    // ENGRAM_RUNTIME=qemu: real guests (README "Real guests"); the simulated runtime otherwise.
    const runtime = yield* runtimeFromEnvironment(env, h.id, stateFile).pipe(Effect.tapError((e) => Effect.logError(e.message)))
    const agent = yield* startHostAgent({
      ...runtime,
      hostId: h.id,
      coordinator: { url: coordinatorUrl, hostToken: h.token },
      peerSecret,
      peers: (id) => urls.get(id),
      listen: { port: 0, host: "127.0.0.1" },
      stateFile,
      imageDir: join(stateDir, `${h.id}-images`),
      measure: (mib) => HostMeter.use((m) => m.measure(mib)).pipe(Effect.provide(layerFixed({ totalMib: h.totalMib, osMib: h.osMib, vcpus: h.vcpus }))),
      config: { pollWaitMs: 10_000, reportIntervalMs: 10_000 },
    })
    urls.set(h.id, `http://127.0.0.1:${agent.port}`)
    // The status bearer derives from the peer secret: it goes to a 0600 file, never to the output.
    const statusFile = join(stateDir, `${h.id}.status-token`)
    writeFileSync(statusFile, `${statusToken(peerSecret, h.id)}\n`, { mode: 0o600 })
    chmodSync(statusFile, 0o600)
    yield* Effect.logInfo(`demo: ${h.id} (${h.totalMib} MiB, ${h.vcpus} vCPUs, ${agent.runtimeInfo.kind === "sim" ? "simulated" : `${agent.runtimeInfo.kind} guests under ${agent.runtimeInfo.accelerator}`}) agent on ${urls.get(h.id)}`, {
      status: `curl -s ${urls.get(h.id)}/v1/peer/status -H "authorization: Bearer $(cat ${statusFile})"`,
    })
  }
  if (tour) {
    yield* sleep(1500)
    yield* runTour(admin, registered.map((r) => r.id)).pipe(Effect.catch((e) => Effect.logWarning("tour stopped", { error: String(e) })))
  }
  return yield* Effect.never
})

NodeRuntime.runMain(Effect.scoped(program).pipe(Effect.provide(Logger.layer([Logger.consolePretty()]))), { disableErrorReporting: true })
