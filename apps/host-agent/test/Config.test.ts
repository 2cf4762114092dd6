/**
 * The agent's configuration through effect Config: every problem at once in `@engram/api`'s
 * one format, secrets never echoed, an unknown ENGRAM_* variable warned about by name.
 */
import { Names } from "@engram/core"
import { Env, Fatal, Main } from "@engram/process"
import { Effect, Exit, Layer, Logger, Redacted, type Scope } from "effect"
import { describe, expect, it } from "vitest"
import { randomBytes } from "node:crypto"
import { existsSync, mkdtempSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { checkedConfig, exitOnConfigInvalid, fromEnvironment, settingBounds, variables } from "../src/Config.js"
import * as Failover from "../src/Failover.js"
import * as PeerLink from "../src/PeerLink.js"
import { defaultAgentConfig } from "../src/Agent.js"
import { startHostAgent } from "../src/Host.js"
import { makeFakeCoordinator } from "./support/FakeCoordinator.js"

const required = {
  ENGRAM_HOST_ID: "h1",
  ENGRAM_COORDINATOR_URL: "http://127.0.0.1:7070",
  ENGRAM_HOST_TOKEN: "host-token-secret-0123456789",
  ENGRAM_PEER_SECRET: "peer-secret-0123456789",
}
/** Another agent's address: moves can work. */
const peers = { ENGRAM_PEERS: "h2=http://10.0.0.2:7100" }
/** `startHostAgent` on a fake coordinator with these options over a valid rest. */
const startedWith = (options: Pick<Parameters<typeof startHostAgent>[0], "config"> & Partial<Parameters<typeof startHostAgent>[0]>) =>
  Effect.flatMap(makeFakeCoordinator, (fake) =>
    startHostAgent({
      hostId: "h",
      coordinator: fake.client("h"),
      peerSecret: "config-test-secret-0123",
      peers: () => undefined,
      measure: () => Effect.succeed({ totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 }),
      ...options,
    }),
  )
const errorOf = async (env: Record<string, string>) => {
  const exit = await Effect.runPromiseExit(fromEnvironment(env))
  return Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: Env.ConfigInvalid }).error : undefined
}


type StartOptions = Partial<Parameters<typeof startHostAgent>[0]>

/**
 * The peer URL a started agent (host `h`, options `o` over a test's defaults) reports in its first
 * report: null for none (no key in the report: the coordinator clears the host's URL), with its
 * bound peer port; its log lines go to `logger` when given.
 */
const reportedBy = (o: StartOptions, logger?: Layer.Layer<never>) =>
  Effect.runPromise(
    Effect.scoped(
      Effect.gen(function* () {
        const fake = yield* makeFakeCoordinator
        const h = yield* startHostAgent({
          hostId: "h",
          coordinator: fake.client("h"),
          peerSecret: "config-test-secret-0123",
          peers: () => undefined,
          measure: () => Effect.succeed({ totalMib: 8192, allocatableMib: 8192, totalVcpus: 4 }),
          ...o,
        })
        yield* h.agent.reportOnce
        const report = (yield* fake.get).reports.get("h")
        return { peerUrl: report?.peerUrl ?? null, hasKey: report !== undefined && "peerUrl" in report, port: h.port }
      }),
    ).pipe(Effect.provide(logger ?? Layer.empty)),
  )

describe("host agent configuration", () => {
  it("the defaults, and the host token kept Redacted", async () => {
    const o = await Effect.runPromise(fromEnvironment(required))
    expect(o).toMatchObject({ hostId: "h1", listen: { port: 7100, host: "127.0.0.1" }, config: { pollWaitMs: 20_000, heartbeatIntervalMs: 40_000 } })
    const token = "url" in o.coordinator ? o.coordinator.hostToken : undefined
    expect(Redacted.isRedacted(token)).toBe(true)
    expect(JSON.stringify(o)).not.toContain("host-token-secret")
  })

  it("every problem is reported at once, naming the variable and the rule; secrets are hidden", async () => {
    const error = await errorOf({
      ENGRAM_COORDINATOR_URL: "http://x",
      ENGRAM_PEER_SECRET: "short-secret",
      ENGRAM_AGENT_PORT: "seven",
      ENGRAM_AGENT_MAX_PRECOPY_ROUNDS: "1",
      ENGRAM_AGENT_MEASURE: "guess",
      ENGRAM_SIM: "{nope",
    })
    expect(error?.message).toBe(
      [
        "invalid host agent configuration:",
        "  ENGRAM_HOST_ID: is required",
        "  ENGRAM_HOST_TOKEN: is required",
        '  ENGRAM_PEER_SECRET="<hidden>": must be at least 16 characters',
        '  ENGRAM_AGENT_MAX_PRECOPY_ROUNDS="1": must be an integer from 2 to 100 (a move that has not converged in 100 rounds will not)',
        '  ENGRAM_AGENT_PORT="seven": must be an integer from 0 to 65535 (a TCP port; 0 takes any free one)',
        '  ENGRAM_SIM="{nope": must be a JSON object of simulated runtime settings',
        '  ENGRAM_AGENT_MEASURE="guess": must be proc or fixed',
      ].join("\n"),
    )
    expect(error?.message).not.toContain("short-secret")
  })

  it("a port past 65535, a host id outside the id rule and a malformed ENGRAM_PEERS are refused at start, naming the variable and the rule", async () => {
    const refused = async (variables: Record<string, string>) => (await errorOf({ ...required, ...variables }))?.message.split("\n").slice(1)
    expect(await refused({ ENGRAM_AGENT_PORT: "70000" })).toStrictEqual(['  ENGRAM_AGENT_PORT="70000": must be an integer from 0 to 65535 (a TCP port; 0 takes any free one)'])
    expect(await refused({ ENGRAM_HOST_ID: "h 1/.." })).toStrictEqual(['  ENGRAM_HOST_ID="h 1/..": must be 1-100 characters of [A-Za-z0-9._-], and not . or ..'])
    expect(await refused({ ENGRAM_HOST_ID: "h".repeat(101) })).toHaveLength(1)
    for (const [peers, rule] of [
      ["h2=notaurl", "host h2's URL must be an absolute http:// or https:// URL"],
      ["h2=ftp://10.0.0.2", "host h2's URL must be an absolute http:// or https:// URL"],
      ["h2=http://10.0.0.2:7100,=http://10.0.0.3:7100", 'is not one'],
      ["h2", '"h2" is not one'],
      ["h2=http://10.0.0.2:7100,h2=http://10.0.0.9:7100", "names host h2 twice"],
      ["h/2=http://10.0.0.2:7100", "each entry's host id must be 1-100 characters"],
    ] as const) {
      const lines = await refused({ ENGRAM_PEERS: peers })
      expect(lines, peers).toHaveLength(1)
      expect(lines?.[0], peers).toContain(`ENGRAM_PEERS=${JSON.stringify(peers)}: `)
      expect(lines?.[0], peers).toContain(rule)
    }
    // Blank entries (a trailing comma) are no entries; an empty URL is none.
    const o = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_PEERS: "h2=http://10.0.0.2:7100,h3=, ," }))
    expect(o.listen).toMatchObject({ port: 7100 })
  })

  it("ENGRAM_PEER_SECRET of whitespace only, or with whitespace around it (a newline copied from a file), is refused naming the variable and the rule, its value hidden", async () => {
    for (const [secret, rule] of [
      [" ".repeat(16), "must not be whitespace only"],
      ["\t\n".repeat(10), "must not be whitespace only"],
      ["peer-secret-0123456789\n", "must not begin or end with whitespace (a newline copied from a file: the other agents' secret differs and every move between them fails with 401)"],
      [" peer-secret-0123456789", "must not begin or end with whitespace (a newline copied from a file: the other agents' secret differs and every move between them fails with 401)"],
    ] as const) {
      const error = await errorOf({ ...required, ENGRAM_PEER_SECRET: secret })
      expect(error?.message, JSON.stringify(secret)).toBe(["invalid host agent configuration:", `  ENGRAM_PEER_SECRET="<hidden>": ${rule}`].join("\n"))
      expect(error?.issues, JSON.stringify(secret)).toEqual([{ variable: "ENGRAM_PEER_SECRET", rule, value: "<hidden>" }])
    }
    expect((await errorOf({ ...required, ENGRAM_PEER_SECRET: "peer-secret-012345678\n" }))?.message).not.toContain("peer-secret")
    // Whitespace inside is part of the secret.
    const inside = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_PEER_SECRET: "correct horse battery staple" }))
    expect(inside.peerSecret).toBe("correct horse battery staple")
  })

  it("an integer is decimal digits: hex, an exponent or a blank is refused naming the variable", async () => {
    for (const v of ["0x1c00", "7e3", " "]) {
      const error = await errorOf({ ...required, ENGRAM_AGENT_PORT: v })
      expect(error?.message, JSON.stringify(v)).toBe(["invalid host agent configuration:", `  ENGRAM_AGENT_PORT=${JSON.stringify(v)}: must be an integer from 0 to 65535 (a TCP port; 0 takes any free one)`].join("\n"))
    }
    const o = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_PORT: "7200" }))
    expect(o.listen).toMatchObject({ port: 7200 })
  })

  it("a whole configuration read from the environment goes through a program's checks unchanged (as `engram agent` passes it)", async () => {
    for (const env of [required, { ...required, ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "60000", ENGRAM_AGENT_IMAGE_GRACE_MS: "600000" }]) {
      const read = (await Effect.runPromise(fromEnvironment(env))).config
      expect(read).toBeDefined()
      expect(await Effect.runPromise(checkedConfig({ hostId: "h1", config: read! }))).toEqual(read)
    }
  })

  it("ENGRAM_AGENT_IMAGE_GRACE_MS: descent images are never removed unless it is set (removal is opt-in)", async () => {
    expect((await Effect.runPromise(fromEnvironment(required))).config?.imageGraceMs).toBeNull()
    expect((await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_IMAGE_GRACE_MS: "600000" }))).config?.imageGraceMs).toBe(600_000)
    expect((await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_IMAGE_GRACE_MS: "0" }))).config?.imageGraceMs).toBe(0)
  })

  it("ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS: a resumed session waits 10 minutes for its image unless set, 0 gives up at the first failure, past a week refused; not warned about as unknown", async () => {
    expect((await Effect.runPromise(fromEnvironment(required))).config?.imageFetchDeadlineMs).toBe(600_000)
    expect((await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS: "0" }))).config?.imageFetchDeadlineMs).toBe(0)
    expect((await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS: "3600000" }))).config?.imageFetchDeadlineMs).toBe(3_600_000)
    expect((await errorOf({ ...required, ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS: "-1" }))?.issues.map((i) => i.variable)).toEqual(["ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS"])
    expect(variables).toContain("ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS")
    // A program's option by the same rule, named by key.
    const exit = await Effect.runPromiseExit(checkedConfig({ hostId: "h", config: { imageFetchDeadlineMs: 7 * 24 * 3_600_000 + 1 } }))
    const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: Env.ConfigInvalid }).error : undefined
    expect(error?.issues.map((i) => i.variable)).toEqual(["config.imageFetchDeadlineMs"])
  })

  it("ENGRAM_AGENT_IMAGE_FETCH_MIN_MIBPS: an image fetch's floor rate, 50 MiB/s unless set, at least 1; the agent's image settings are warned about as unknown by no one", async () => {
    expect((await Effect.runPromise(fromEnvironment(required))).imageFetchMinMibPerSec).toBe(50)
    expect((await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_IMAGE_FETCH_MIN_MIBPS: "10" }))).imageFetchMinMibPerSec).toBe(10)
    const error = await errorOf({ ...required, ENGRAM_AGENT_IMAGE_FETCH_MIN_MIBPS: "0" })
    expect(error?.message).toBe(["invalid host agent configuration:", '  ENGRAM_AGENT_IMAGE_FETCH_MIN_MIBPS="0": must be an integer from 1 to 102400 (100 GiB/s)'].join("\n"))
    const lines: string[] = []
    const capture = Logger.layer([Logger.make(({ logLevel, message }) => void lines.push(`${logLevel} ${String(Array.isArray(message) ? message[0] : message)}`))])
    await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_IMAGE_FETCH_MIN_MIBPS: "10", ENGRAM_AGENT_IMAGE_GRACE_MS: "0" }).pipe(Effect.provide(capture)))
    expect(lines.filter((l) => l.startsWith("Warn"))).toEqual([])
  })

  it("ENGRAM_AGENT_MOVE_INTENT: off by default, 1 turns the move's intent on, anything else is refused by name and rule", async () => {
    expect((await Effect.runPromise(fromEnvironment(required))).config?.moveIntent).toBe(false)
    expect((await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_MOVE_INTENT: "0" }))).config?.moveIntent).toBe(false)
    expect((await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_MOVE_INTENT: "1" }))).config?.moveIntent).toBe(true)
    const error = await errorOf({ ...required, ENGRAM_AGENT_MOVE_INTENT: "yes" })
    expect(error?.message).toBe(["invalid host agent configuration:", '  ENGRAM_AGENT_MOVE_INTENT="yes": must be 0 or 1'].join("\n"))
  })

  it("ENGRAM_AGENT_OLD_MOVE_TOKENS: on by default (a rolling upgrade), 0 turns the old move token off, anything else is refused by name and rule; a program's config.oldMoveTokens must be a boolean", async () => {
    expect((await Effect.runPromise(fromEnvironment(required))).config?.oldMoveTokens).toBe(true)
    expect((await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_OLD_MOVE_TOKENS: "1" }))).config?.oldMoveTokens).toBe(true)
    expect((await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_OLD_MOVE_TOKENS: "0" }))).config?.oldMoveTokens).toBe(false)
    const error = await errorOf({ ...required, ENGRAM_AGENT_OLD_MOVE_TOKENS: "off" })
    expect(error?.message).toBe(["invalid host agent configuration:", '  ENGRAM_AGENT_OLD_MOVE_TOKENS="off": must be 0 or 1'].join("\n"))
    expect((await Effect.runPromise(checkedConfig({ hostId: "h", config: { oldMoveTokens: false } }))).oldMoveTokens).toBe(false)
    const refused = await Effect.runPromise(Effect.flip(checkedConfig({ hostId: "h", config: { oldMoveTokens: "no" as unknown as boolean } })))
    expect(refused.issues).toEqual([{ variable: "config.oldMoveTokens", rule: "must be true or false", value: "no" }])
  })

  it("an ENGRAM_* variable no engram component reads is warned about by name; the coordinator's and the CLI's are not", async () => {
    const lines: string[] = []
    const capture = Logger.layer([Logger.make(({ logLevel, message }) => void lines.push(`${logLevel} ${String(Array.isArray(message) ? message[0] : message)}`))])
    await Effect.runPromise(fromEnvironment({ ...required, ...peers, ENGRAM_AGENT_POLL_WAIT: "5", ENGRAM_PORT: "7070", ENGRAM_REAPER_INTERVAL_MS: "100", ENGRAM_TIMEOUT_MS: "5000" }).pipe(Effect.provide(capture)))
    expect(lines.filter((l) => l.startsWith("Warn"))).toEqual([
      "Warn ENGRAM_AGENT_POLL_WAIT is not a setting of any engram component and is ignored (did you mean ENGRAM_AGENT_POLL_WAIT_MS?)",
    ])
  })

  it("an agent that advertises no peer URL (a wildcard host, nothing else set) is warned about once at start: moves to this host fail, and what to do; no ENGRAM_PEERS is not", async () => {
    const warningsOf = async (env: Record<string, string>) => {
      const lines: string[] = []
      const capture = Logger.layer([Logger.make(({ logLevel, message }) => void lines.push(`${logLevel} ${String(Array.isArray(message) ? message[0] : message)}`))])
      await Effect.runPromiseExit(fromEnvironment(env).pipe(Effect.provide(capture)))
      return lines.filter((l) => l.startsWith("Warn"))
    }
    const rest =
      ", and none of ENGRAM_AGENT_PEER_URL, this host's entry in ENGRAM_PEERS and ENGRAM_AGENT_ADVERTISE_HOST is set): the coordinator's reaper moves no session here to make room, and a move to this host asked for through the API fails unless the source's ENGRAM_PEERS names it. Set ENGRAM_AGENT_PEER_URL, this host's entry in ENGRAM_PEERS, or ENGRAM_AGENT_ADVERTISE_HOST (the address peers reach this host at)"
    // No ENGRAM_PEERS, on a host peers reach: the coordinator gives the addresses, nothing to say.
    expect(await warningsOf(required)).toEqual([])
    expect(await warningsOf({ ...required, ENGRAM_AGENT_HOST: "0.0.0.0" })).toEqual([`Warn this agent advertises no peer URL (ENGRAM_AGENT_HOST "0.0.0.0" is a wildcard${rest}`])
    expect(await warningsOf({ ...required, ENGRAM_AGENT_HOST: "::" })).toEqual([`Warn this agent advertises no peer URL (ENGRAM_AGENT_HOST "::" is a wildcard${rest}`])
    expect(await warningsOf({ ...required, ENGRAM_AGENT_HOST: "0.0.0.0", ENGRAM_AGENT_ADVERTISE_HOST: "10.0.0.1" })).toEqual([])
    expect(await warningsOf({ ...required, ENGRAM_AGENT_HOST: "0.0.0.0", ENGRAM_AGENT_PEER_URL: "http://10.0.0.1:7100" })).toEqual([])
    // Its own ENGRAM_PEERS entry is advertised; another host's entry alone, or an own entry that breaks the rule, is not.
    expect(await warningsOf({ ...required, ENGRAM_AGENT_HOST: "0.0.0.0", ENGRAM_PEERS: "h1=http://10.0.0.1:7100,h2=http://10.0.0.2:7100" })).toEqual([])
    expect(await warningsOf({ ...required, ...peers, ENGRAM_AGENT_HOST: "0.0.0.0" })).toEqual([`Warn this agent advertises no peer URL (ENGRAM_AGENT_HOST "0.0.0.0" is a wildcard${rest}`])
    // An own entry that breaks the rule is set, not missing: the agent names it at start (below), not this.
    expect(await warningsOf({ ...required, ENGRAM_AGENT_HOST: "0.0.0.0", ENGRAM_PEERS: "h1=http://0.0.0.0:7100" })).toEqual([])
    // A configuration refused is not warned about: its issues are the one thing said.
    expect(await warningsOf({ ...required, ENGRAM_AGENT_HOST: "0.0.0.0", ENGRAM_AGENT_PORT: "seven" })).toEqual([])
  })

  it("every variable the agent reads is in @engram/process's list", () => {
    for (const v of variables) expect(Env.knownVariables.has(v), v).toBe(true)
  })

  it("ENGRAM_RUNTIME=qemu selects QEMU: the guest named, the state directory beside the state file, the move data plane on the agent's host", async () => {
    const o = await Effect.runPromise(
      fromEnvironment({
        ...required,
        ENGRAM_RUNTIME: "qemu",
        ENGRAM_QEMU_DISK: "/var/lib/engram/guest.qcow2",
        ENGRAM_AGENT_STATE_FILE: "/var/lib/engram/agent.json",
        ENGRAM_AGENT_HOST: "10.0.0.2",
        ENGRAM_QEMU_MOVE_MIB_S: "64",
      }),
    )
    expect(o.qemu).toEqual({
      stateDir: "/var/lib/engram/engram-qemu-h1",
      memory: "file",
      boot: { kind: "disk", disk: "/var/lib/engram/guest.qcow2" },
      accelerator: "auto",
      moveBandwidthBytesPerSec: 64 * 1024 * 1024,
    })
    expect(o.migration).toEqual({ listenHost: "10.0.0.2" })
    const kernel = await Effect.runPromise(
      fromEnvironment({
        ...required,
        ENGRAM_RUNTIME: "qemu",
        ENGRAM_QEMU_STATE_DIR: "/run/eq",
        ENGRAM_QEMU_KERNEL: "/boot/vmlinuz",
        ENGRAM_QEMU_INITRD: "/boot/initrd",
        ENGRAM_QEMU_APPEND: "console=ttyS0",
        ENGRAM_QEMU_ACCEL: "tcg",
        ENGRAM_AGENT_MIGRATION_HOST: "0.0.0.0",
        ENGRAM_AGENT_ADVERTISE_HOST: "host-b.internal",
        ENGRAM_QEMU_MEMORY: "file",
        ENGRAM_QEMU_RAM_DIR: "/dev/shm/eq",
        ENGRAM_QEMU_READY_LINE: "^login:",
        ENGRAM_AGENT_TEMPLATES: "small=256:1, big=1024:2",
      }),
    )
    expect(kernel.qemu).toEqual({
      stateDir: "/run/eq",
      memory: "file",
      ramDir: "/dev/shm/eq",
      readyLine: /^login:/,
      boot: { kind: "kernel", kernel: "/boot/vmlinuz", initrd: "/boot/initrd", append: "console=ttyS0" },
      accelerator: "tcg",
    })
    expect(kernel.config?.templates).toEqual([
      { name: "small", memMib: 256, vcpus: 1 },
      { name: "big", memMib: 1024, vcpus: 2 },
    ])
    expect(kernel.migration).toEqual({ listenHost: "0.0.0.0", advertiseHost: "host-b.internal" })
    // The default stays the simulated runtime.
    expect((await Effect.runPromise(fromEnvironment(required))).qemu).toBeUndefined()
  })

  it("runtime settings that contradict each other are reported with the rest, all at once", async () => {
    const qemu = await errorOf({ ...required, ENGRAM_RUNTIME: "qemu", ENGRAM_QEMU_KERNEL: "/k", ENGRAM_QEMU_DISK: "/d.img", ENGRAM_QEMU_ACCEL: "fast", ENGRAM_SIM: "{}" })
    expect(qemu?.message).toBe(
      [
        "invalid host agent configuration:",
        '  ENGRAM_QEMU_ACCEL="fast": must be auto, kvm or tcg',
        '  ENGRAM_SIM="{}": applies only with ENGRAM_RUNTIME=sim',
        '  ENGRAM_QEMU_DISK="/d.img": cannot be set with ENGRAM_QEMU_KERNEL (a guest boots one or the other)',
      ].join("\n"),
    )
    const sim = await errorOf({ ...required, ENGRAM_RUNTIME: "firecracker", ENGRAM_QEMU_INITRD: "/i" })
    expect(sim?.message).toBe(['invalid host agent configuration:', '  ENGRAM_RUNTIME="firecracker": must be sim or qemu'].join("\n"))
    // The agent boots what it is told: no guest named is a start-up error, not a built-in guest.
    const noGuest = await errorOf({ ...required, ENGRAM_RUNTIME: "qemu" })
    expect(noGuest?.message).toBe(
      ["invalid host agent configuration:", "  ENGRAM_QEMU_KERNEL: or ENGRAM_QEMU_DISK is required with ENGRAM_RUNTIME=qemu (the guest every VM boots)"].join("\n"),
    )
    const forgotten = await errorOf({ ...required, ENGRAM_QEMU_KERNEL: "/k" })
    expect(forgotten?.message).toBe(['invalid host agent configuration:', '  ENGRAM_QEMU_KERNEL="/k": applies only with ENGRAM_RUNTIME=qemu'].join("\n"))
    const snapshots = await errorOf({
      ...required,
      ENGRAM_RUNTIME: "qemu",
      ENGRAM_QEMU_MEMORY: "anonymous",
      ENGRAM_QEMU_RAM_DIR: "/dev/shm/eq",
      ENGRAM_QEMU_READY_LINE: "(",
      ENGRAM_AGENT_TEMPLATES: "small=256",
    })
    expect(snapshots?.message).toMatch(/ENGRAM_QEMU_READY_LINE="\(": must be a regular expression/)
    expect(snapshots?.message).toMatch(/ENGRAM_AGENT_TEMPLATES="small=256": must be name=memMib:vcpus/)
    expect(snapshots?.message).toMatch(/ENGRAM_QEMU_RAM_DIR="\/dev\/shm\/eq": applies to ENGRAM_QEMU_MEMORY=file/)
    const badName = await errorOf({ ...required, ENGRAM_AGENT_TEMPLATES: "a/b=256:1" })
    expect(badName?.message).toMatch(/a template name must be 1-100 characters of \[A-Za-z0-9._-\]/)
  })

  it("ENGRAM_SIM holds the simulated runtime's settings only, each a number at least its least: an unknown key or a wrong value is refused naming the key", async () => {
    const keys = "dirtyBytesPerMs, workingSetBytes, captureBytesPerMs, captureFixedMs, finalCaptureExtraMs, pauseDelayMs, linkBytesPerMs, fullWireRatio, roundOverheadBytes, commitMs, startMs, templateStartMs, guestBusyMs"
    for (const [sim, rule] of [
      ['{"finalCaptureExtraMS":300}', `"finalCaptureExtraMS" is not a simulated runtime setting (${keys})`],
      ['{"commitMs":20,"nope":1}', `"nope" is not a simulated runtime setting (${keys})`],
      ['{"commitMs":"420"}', 'setting commitMs must be a number >= 0; "420" is not'],
      ['{"commitMs":null}', "setting commitMs must be a number >= 0; null is not"],
      ['{"startMs":-1}', "setting startMs must be a number >= 0; -1 is not"],
      ['{"guestBusyMs":1e999}', "setting guestBusyMs must be a number >= 0; Infinity is not"],
      ['{"linkBytesPerMs":0}', "setting linkBytesPerMs must be a number >= 0.001; 0 is not"],
      ['{"linkBytesPerMs":5e-324}', "setting linkBytesPerMs must be a number >= 0.001; 5e-324 is not"],
      ['{"captureBytesPerMs":0.0005}', "setting captureBytesPerMs must be a number >= 0.001; 0.0005 is not"],
      ['{"captureBytesPerMs":false}', "setting captureBytesPerMs must be a number >= 0.001; false is not"],
      ["[1]", "must be a JSON object of simulated runtime settings"],
    ] as const) {
      const error = await errorOf({ ...required, ENGRAM_SIM: sim })
      expect(error?.message, sim).toBe(["invalid host agent configuration:", `  ENGRAM_SIM=${JSON.stringify(sim)}: ${rule}`].join("\n"))
    }
    // The end-to-end tests' settings, none, and the least of each.
    for (const sim of ['{"finalCaptureExtraMs":300}', '{"commitMs":20,"dirtyBytesPerMs":65536,"workingSetBytes":1048576}', '{"commitMs":2500,"pauseDelayMs":1500}', "{}", '{"commitMs":0,"fullWireRatio":0.05,"linkBytesPerMs":0.5}']) {
      const o = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_SIM: sim }))
      expect(o.sim, sim).toEqual(JSON.parse(sim))
    }
  })

  it("ENGRAM_SIM's sizes, speeds and times have a largest (any finite figure was taken: a working set of 1e300 bytes), refused naming the key, the bound and why; the largest is taken", async () => {
    for (const [sim, rule] of [
      ['{"workingSetBytes":1e300}', "setting workingSetBytes must be a number <= 17592186044416 (16 TiB: more RAM than one host holds); 1e+300 is not"],
      ['{"linkBytesPerMs":1073741825}', "setting linkBytesPerMs must be a number <= 1073741824 (1 GiB per ms, about a TiB/s: far past any memory bus or link); 1073741825 is not"],
      ['{"commitMs":3600001}', "setting commitMs must be a number <= 3600000 (an hour); 3600001 is not"],
      ['{"fullWireRatio":11}', "setting fullWireRatio must be a number <= 10 (ten wire bytes per byte: a capture sends about its bytes or fewer); 11 is not"],
      ['{"roundOverheadBytes":1e12}', "setting roundOverheadBytes must be a number <= 1073741824 (1 GiB a round); 1000000000000 is not"],
      ['{"guestBusyMs":1e15}', "setting guestBusyMs must be a number <= 31536000000 (a year); 1000000000000000 is not"],
    ] as const) {
      const error = await errorOf({ ...required, ENGRAM_SIM: sim })
      expect(error?.message, sim).toBe(["invalid host agent configuration:", `  ENGRAM_SIM=${JSON.stringify(sim)}: ${rule}`].join("\n"))
    }
    const most = { workingSetBytes: 16 * 1024 ** 4, linkBytesPerMs: 1024 ** 3, commitMs: 3_600_000, fullWireRatio: 10, guestBusyMs: 31_536_000_000 }
    expect((await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_SIM: JSON.stringify(most) }))).sim).toEqual(most)
  })

  it("ENGRAM_SIM with a key given twice is refused naming the key (JSON.parse kept the last, so which was meant is not known), by the API's rule", async () => {
    for (const [sim, key] of [
      ['{"startMs":-1,"startMs":1}', "startMs"],
      ['{"commitMs":20,"pauseDelayMs":5,"commitMs":20}', "commitMs"],
      ['{"commitMs":20,"\\u0063ommitMs":30}', "commitMs"],
    ] as const) {
      const error = await errorOf({ ...required, ENGRAM_SIM: sim })
      expect(error?.issues, sim).toEqual([{ variable: "ENGRAM_SIM", rule: `setting ${key} is given more than once in one object (each key at most once)`, value: sim }])
    }
  })

  it("a heartbeat interval not below the stale window is refused (the host would go stale between its heartbeats), with the rest; just below is accepted", async () => {
    const rule = (windowMs: number) => `must be less than ENGRAM_HEARTBEAT_STALE_WINDOW_MS (${windowMs}): a host that heartbeats less often goes stale between its heartbeats`
    const equal = await errorOf({ ...required, ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "30000", ENGRAM_AGENT_HEARTBEAT_MS: "30000", ENGRAM_AGENT_PORT: "seven" })
    expect(equal?.message).toBe(
      ["invalid host agent configuration:", '  ENGRAM_AGENT_PORT="seven": must be an integer from 0 to 65535 (a TCP port; 0 takes any free one)', `  ENGRAM_AGENT_HEARTBEAT_MS="30000": ${rule(30_000)}`].join("\n"),
    )
    // The coordinator's default window when the agent is not told another.
    const overDefault = await errorOf({ ...required, ENGRAM_AGENT_HEARTBEAT_MS: "120000" })
    expect(overDefault?.issues).toEqual([{ variable: "ENGRAM_AGENT_HEARTBEAT_MS", rule: rule(120_000), value: "120000" }])
    const edge = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "30000", ENGRAM_AGENT_HEARTBEAT_MS: "29999" }))
    expect(edge.config?.heartbeatIntervalMs).toBe(29_999)
  })

  it("a report interval not below the stale window is refused (the host would look silent between its reports and take no placements); just below is accepted", async () => {
    const rule = (windowMs: number) =>
      `must be less than ENGRAM_HEARTBEAT_STALE_WINDOW_MS (${windowMs}): a host that reports less often looks silent between its reports and takes no placements`
    const equal = await errorOf({ ...required, ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "30000", ENGRAM_AGENT_REPORT_MS: "30000" })
    expect(equal?.issues).toEqual([{ variable: "ENGRAM_AGENT_REPORT_MS", rule: rule(30_000), value: "30000" }])
    // The coordinator's default window when the agent is not told another.
    const overDefault = await errorOf({ ...required, ENGRAM_AGENT_REPORT_MS: "120000" })
    expect(overDefault?.issues).toEqual([{ variable: "ENGRAM_AGENT_REPORT_MS", rule: rule(120_000), value: "120000" }])
    const edge = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "30000", ENGRAM_AGENT_REPORT_MS: "29999" }))
    expect(edge.config?.reportIntervalMs).toBe(29_999)
    // Unset under a short window, the interval is a third of it (30 s under the default window).
    const short = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "30000" }))
    expect(short.config?.reportIntervalMs).toBe(10_000)
    expect((await Effect.runPromise(fromEnvironment(required))).config?.reportIntervalMs).toBe(30_000)
  })

  it("a stale window of 1 ms is refused naming the intervals' variables (their defaults, a third of it and at least 1 ms, are not below it), not a program's keys; 2 ms is accepted", async () => {
    const window = "must be less than ENGRAM_HEARTBEAT_STALE_WINDOW_MS (1): a host that"
    const tiny = await errorOf({ ...required, ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "1" })
    expect(tiny?.message).toBe(
      [
        "invalid host agent configuration:",
        `  ENGRAM_AGENT_HEARTBEAT_MS: ${window} heartbeats less often goes stale between its heartbeats (unset, it is 1)`,
        `  ENGRAM_AGENT_REPORT_MS: ${window} reports less often looks silent between its reports and takes no placements (unset, it is 1)`,
      ].join("\n"),
    )
    // One given is judged as given, the other by its default.
    const given = await errorOf({ ...required, ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "1", ENGRAM_AGENT_HEARTBEAT_MS: "1" })
    expect(given?.issues.map((i) => [i.variable, i.value])).toEqual([
      ["ENGRAM_AGENT_HEARTBEAT_MS", "1"],
      ["ENGRAM_AGENT_REPORT_MS", undefined],
    ])
    const least = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_HEARTBEAT_STALE_WINDOW_MS: "2" }))
    expect(least.config).toMatchObject({ heartbeatIntervalMs: 1, reportIntervalMs: 1, heartbeatStaleWindowMs: 2 })
  })

  it("the assignments poll waits at most the coordinator's 30 s (it never holds one longer); 30 s is accepted", async () => {
    const over = await errorOf({ ...required, ENGRAM_AGENT_POLL_WAIT_MS: "30001" })
    expect(over?.issues).toEqual([
      { variable: "ENGRAM_AGENT_POLL_WAIT_MS", rule: "must be an integer from 0 to 30000 (the longest the coordinator holds an assignments poll)", value: "30001" },
    ])
    const edge = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_POLL_WAIT_MS: "30000" }))
    expect(edge.config?.pollWaitMs).toBe(30_000)
  })
})

describe("ENGRAM_COORDINATOR_URL: one coordinator URL, or several replicas' (comma-separated)", () => {
  const urlOf = async (value: string) => {
    const o = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_COORDINATOR_URL: value }))
    return "url" in o.coordinator ? o.coordinator.url : undefined
  }
  const refused = async (value: string) => (await errorOf({ ...required, ENGRAM_COORDINATOR_URL: value }))?.message

  it("one URL is taken as given, a trailing slash and a path prefix kept (the client strips the slash); several in order, spaces around commas ignored", async () => {
    expect(await urlOf("http://127.0.0.1:7070")).toBe("http://127.0.0.1:7070")
    expect(await urlOf("https://lb.internal/engram/")).toBe("https://lb.internal/engram/")
    expect(await urlOf("http://c1:7070, http://c2:7070/,https://c3.internal/engram")).toEqual(["http://c1:7070", "http://c2:7070/", "https://c3.internal/engram"])
  })

  it("a URL that is not absolute http(s), an empty item, user:password@ or a URL twice is refused at start, naming the variable and the rule", async () => {
    const rule = "must be one or more absolute http:// or https:// URLs, comma-separated"
    const line = (value: string, why: string) => ["invalid host agent configuration:", `  ENGRAM_COORDINATOR_URL=${JSON.stringify(value)}: ${rule}${why}`].join("\n")
    expect(await refused("127.0.0.1:7070")).toBe(line("127.0.0.1:7070", ' ("127.0.0.1:7070" is not one)'))
    expect(await refused("http://c1:7070,c2:7070")).toBe(line("http://c1:7070,c2:7070", ' ("c2:7070" is not one)'))
    expect(await refused("ftp://c1")).toBe(line("ftp://c1", ' ("ftp://c1" is not one)'))
    expect(await refused("/v1")).toBe(line("/v1", ' ("/v1" is not one)'))
    expect(await refused("http://c1:7070,,http://c2:7070")).toBe(line("http://c1:7070,,http://c2:7070", ", none empty"))
    expect(await refused("http://c1:7070,")).toBe(line("http://c1:7070,", ", none empty"))
    expect(await refused("")).toBe(["invalid host agent configuration:", "  ENGRAM_COORDINATOR_URL: is required"].join("\n"))
    expect(await refused("http://c1:7070, http://C1:7070/")).toBe(line("http://c1:7070, http://C1:7070/", ', each once ("http://C1:7070/" repeats "http://c1:7070")'))
    // The password is never echoed, in the value or in the rule.
    expect(await refused("http://agent:pw@c1:7070")).toBe(line("http://***@c1:7070", ", without user:password@ (the token authenticates)"))
    expect(await refused("http://u:p@ss@c1:7070")).toBe(line("http://***@c1:7070", ", without user:password@ (the token authenticates)"))
    expect(await refused("http://c1:7070,agent:pw@c2:7070")).toBe(line("http://c1:7070,***@c2:7070", ' ("***@c2:7070" is not one)'))
    expect(await refused("http://u:pa/ss@c1:7070")).toBe(line("http://***", ' ("http://***" is not one)'))
    // A query or fragment (a token there would be logged with every switch), itself never echoed.
    expect(await refused("http://c1:7070/?token=x")).toBe(line("http://c1:7070/?***", ', without a query or fragment ("http://c1:7070/?***" has one)'))
    expect(await refused("http://c1:7070/#x")).toBe(line("http://c1:7070/#***", ', without a query or fragment ("http://c1:7070/#***" has one)'))
    // An IPv6 address and a path with ":" and "@" are no secret.
    expect(Failover.redactUrl("http://[::1]:7070,http://c1:7070/a:b@c")).toBe("http://[::1]:7070,http://c1:7070/a:b@c")
  })
})

// A program's options (`startHostAgent`) go through the environment's checks, named by key.
describe("a program's agent options", () => {
  const issuesOf = async (o: Parameters<typeof checkedConfig>[0]) => {
    const exit = await Effect.runPromiseExit(checkedConfig(o))
    const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: Env.ConfigInvalid }).error : undefined
    return error?.issues.map((i) => [i.variable, i.rule, i.value])
  }
  const rule = (windowMs: number) => `must be less than heartbeatStaleWindowMs (${windowMs}): a host that heartbeats less often goes stale between its heartbeats`

  it("a peer secret by ENGRAM_PEER_SECRET's rule, named peerSecret, its value never shown; a good one is accepted", async () => {
    for (const [secret, words] of [
      ["short-secret", "at least 16 characters"],
      [" ".repeat(20), "whitespace only"],
      ["a-good-long-secret-0123\n", "must not begin or end with whitespace"],
    ] as const) {
      const issues = await issuesOf({ hostId: "h", peerSecret: secret })
      expect(issues, JSON.stringify(secret)).toHaveLength(1)
      const [variable, rule, value] = issues![0]!
      expect([variable, value]).toEqual(["peerSecret", undefined])
      expect(rule).toContain(words)
    }
    // Beside another problem: both at once.
    expect((await issuesOf({ hostId: "h", peerSecret: "short", config: { heartbeatIntervalMs: 0 } }))?.map(([v]) => v).sort()).toEqual(["config.heartbeatIntervalMs", "peerSecret"])
    expect(await issuesOf({ hostId: "h", peerSecret: "a-good-long-secret-0123" })).toBeUndefined()
  })

  it("a heartbeat interval not below the stale window is refused, as from the environment; just below is accepted", async () => {
    expect(await issuesOf({ hostId: "h", config: { heartbeatIntervalMs: 120_000 } })).toEqual([["config.heartbeatIntervalMs", rule(120_000), 120_000]])
    expect(await issuesOf({ hostId: "h", heartbeatStaleWindowMs: 30_000, config: { heartbeatIntervalMs: 30_000 } })).toEqual([["config.heartbeatIntervalMs", rule(30_000), 30_000]])
    const edge = await Effect.runPromise(checkedConfig({ hostId: "h", heartbeatStaleWindowMs: 30_000, config: { heartbeatIntervalMs: 29_999 } }))
    expect(edge.heartbeatIntervalMs).toBe(29_999)
    // Judged beside another setting's refusal, all at once.
    expect(await issuesOf({ hostId: "h", heartbeatStaleWindowMs: 30_000, config: { heartbeatIntervalMs: 30_000, reportIntervalMs: 0 } })).toEqual([
      ["config.reportIntervalMs", "must be an integer >= 1", 0],
      ["config.heartbeatIntervalMs", rule(30_000), 30_000],
    ])
    // Unset, the interval is a third of the window given.
    expect((await Effect.runPromise(checkedConfig({ hostId: "h", heartbeatStaleWindowMs: 30_000 }))).heartbeatIntervalMs).toBe(10_000)
  })

  it("a report interval not below the stale window is refused, as from the environment; just below is accepted", async () => {
    const reportRule = (windowMs: number) =>
      `must be less than heartbeatStaleWindowMs (${windowMs}): a host that reports less often looks silent between its reports and takes no placements`
    expect(await issuesOf({ hostId: "h", config: { reportIntervalMs: 120_000 } })).toEqual([["config.reportIntervalMs", reportRule(120_000), 120_000]])
    expect(await issuesOf({ hostId: "h", heartbeatStaleWindowMs: 30_000, config: { reportIntervalMs: 30_000 } })).toEqual([["config.reportIntervalMs", reportRule(30_000), 30_000]])
    const edge = await Effect.runPromise(checkedConfig({ hostId: "h", heartbeatStaleWindowMs: 30_000, config: { reportIntervalMs: 29_999 } }))
    expect(edge.reportIntervalMs).toBe(29_999)
    // Unset, it is 30 s, or a third of a shorter window.
    expect((await Effect.runPromise(checkedConfig({ hostId: "h", heartbeatStaleWindowMs: 30_000 }))).reportIntervalMs).toBe(10_000)
    expect((await Effect.runPromise(checkedConfig({ hostId: "h" }))).reportIntervalMs).toBe(30_000)
  })

  it("a stale window the coordinator takes (four days: it takes windows longer than a day) is taken by the agent too", async () => {
    const day = 24 * 3_600_000
    expect((await Effect.runPromise(checkedConfig({ hostId: "h", heartbeatStaleWindowMs: 4 * day }))).heartbeatIntervalMs).toBe(Math.floor((4 * day) / 3))
    expect((await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_HEARTBEAT_STALE_WINDOW_MS: String(4 * day) }))).heartbeatStaleWindowMs).toBe(4 * day)
  })

  it("a stale window of 1 ms is refused with the intervals left unset (their defaults are not below it), named by key", async () => {
    expect(await issuesOf({ hostId: "h", heartbeatStaleWindowMs: 1 })).toEqual([
      ["config.heartbeatIntervalMs", `${rule(1)} (unset, it is 1)`, undefined],
      ["config.reportIntervalMs", "must be less than heartbeatStaleWindowMs (1): a host that reports less often looks silent between its reports and takes no placements (unset, it is 1)", undefined],
    ])
    expect((await Effect.runPromise(checkedConfig({ hostId: "h", heartbeatStaleWindowMs: 2 }))).heartbeatIntervalMs).toBe(1)
  })

  it("each setting's own range holds, every issue at once, named by key; a null, an unknown key, a bad flag or template are refused", async () => {
    const config = { reportIntervalMs: 0, pollWaitMs: 30_001, retryDelayMs: null, maxPreCopyRounds: 1.5, moveIntent: "yes", templates: [{ name: "a/b", memMib: 256, vcpus: 1 }], heartbeatMS: 5 }
    expect(await issuesOf({ hostId: "h", heartbeatStaleWindowMs: null, config } as unknown as Parameters<typeof checkedConfig>[0])).toEqual([
      ["config.moveIntent", "must be true or false", "yes"],
      ["config.templates", `a template name ${Names.templateNameRule}: "a/b"`, undefined],
      ["config.heartbeatMS", "is not a known setting", undefined],
      ["heartbeatStaleWindowMs", "must be an integer from 1 to 31536000000 (a year: windows of days are in use, and every agent must take its coordinator's)", null],
      ["config.reportIntervalMs", "must be an integer >= 1", 0],
      ["config.pollWaitMs", "must be an integer from 0 to 30000 (the longest the coordinator holds an assignments poll)", 30_001],
      ["config.retryDelayMs", "must be an integer from 1 to 60000 (a minute: failures in a row back off to 30 times it, and a failed assignments poll takes no command until then)", null],
      ["config.maxPreCopyRounds", "must be an integer from 2 to 100 (a move that has not converged in 100 rounds will not)", 1.5],
    ])
    expect(await issuesOf({ hostId: "h", config: { templates: [{ name: "t", memMib: 0, vcpus: 1 }] } })).toEqual([
      ["config.templates", 'needs a memMib and vcpus that are integers > 0: "t=0:1"', undefined],
    ])
    // The edges: the least of each, the poll's longest.
    const least = await Effect.runPromise(
      checkedConfig({ hostId: "h", heartbeatStaleWindowMs: 2, config: { heartbeatIntervalMs: 1, reportIntervalMs: 1, pollWaitMs: 30_000, retryDelayMs: 1, maxPreCopyRounds: 2, moveIntent: true } }),
    )
    expect(least).toMatchObject({ heartbeatIntervalMs: 1, reportIntervalMs: 1, pollWaitMs: 30_000, retryDelayMs: 1, maxPreCopyRounds: 2, moveIntent: true })
  })

  it("startHostAgent refuses them before it starts anything (no state file written), with the environment's error", async () => {
    const stateFile = join(mkdtempSync(join(tmpdir(), "engram-agent-config-")), "state.json")
    const exit = await Effect.runPromiseExit(
      Effect.scoped(
        startedWith({ stateFile, heartbeatStaleWindowMs: 3000, config: { heartbeatIntervalMs: 3000 } }),
      ),
    )
    const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: unknown }).error : undefined
    expect(error).toBeInstanceOf(Env.ConfigInvalid)
    expect((error as Env.ConfigInvalid).message).toBe(["invalid host agent configuration:", `  config.heartbeatIntervalMs=3000: ${rule(3000)}`].join("\n"))
    expect(existsSync(stateFile)).toBe(false)
  })

  it("a program's sim option is held to ENGRAM_SIM's rule: a denormal speed, an unknown key or a figure past its largest is refused naming sim, before anything starts", async () => {
    const refusal = async (sim: unknown) => {
      const stateFile = join(mkdtempSync(join(tmpdir(), "engram-agent-config-")), "state.json")
      const exit = await Effect.runPromiseExit(Effect.scoped(startedWith({ stateFile, config: {}, sim: sim as NonNullable<StartOptions["sim"]> })))
      const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: unknown }).error : undefined
      expect(existsSync(stateFile), JSON.stringify(sim)).toBe(false)
      return error instanceof Env.ConfigInvalid ? error.message : String(error)
    }
    expect(await refusal({ linkBytesPerMs: 5e-324 })).toBe(["invalid host agent configuration:", "  sim: setting linkBytesPerMs must be a number >= 0.001; 5e-324 is not"].join("\n"))
    expect(await refusal({ startMs: 5, linkBytes: 1 })).toContain('sim: "linkBytes" is not a simulated runtime setting')
    expect(await refusal({ commitMs: 3_600_001 })).toContain("sim: setting commitMs must be a number <= 3600000 (an hour); 3600001 is not")
    // Within the rule: it starts.
    await Effect.runPromise(Effect.scoped(Effect.asVoid(startedWith({ config: {}, sim: { startMs: 5, linkBytesPerMs: 0.001 } }))))
  })

  it("the agent's process ends on startHostAgent's refusal as on the environment's (main.ts): exit 2, the issues in the same message; other failures pass", async () => {
    const fatalOf = async <A, E>(eff: Effect.Effect<A, E | Env.ConfigInvalid, Scope.Scope>) => {
      const exit = await Effect.runPromiseExit(Effect.scoped(exitOnConfigInvalid(eff)))
      return Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: unknown }).error : undefined
    }
    const started = await fatalOf(startedWith({ config: { reportIntervalMs: 0 } }))
    expect(started).toBeInstanceOf(Fatal)
    expect(started).toMatchObject({ exitCode: Main.exitCodes.configuration, message: ["invalid host agent configuration:", "  config.reportIntervalMs=0: must be an integer >= 1"].join("\n") })
    const environment = await fatalOf(fromEnvironment({ ...required, ENGRAM_AGENT_REPORT_MS: "0" }))
    expect(environment).toMatchObject({ exitCode: Main.exitCodes.configuration, message: ["invalid host agent configuration:", '  ENGRAM_AGENT_REPORT_MS="0": must be an integer >= 1'].join("\n") })
    expect(await fatalOf(Effect.fail("the runtime cannot run here"))).toBe("the runtime cannot run here")
  })
})

describe("the simulated host's sizes (ENGRAM_AGENT_MEASURE=fixed)", () => {
  it("the system's share larger than the host is refused, naming both; equal is accepted", async () => {
    const fixed = { ...required, ENGRAM_AGENT_MEASURE: "fixed" }
    const over = await errorOf({ ...fixed, ENGRAM_SIM_TOTAL_MIB: "2048", ENGRAM_SIM_OS_MIB: "2049" })
    expect(over?.issues).toEqual([
      { variable: "ENGRAM_SIM_OS_MIB", rule: "must be at most ENGRAM_SIM_TOTAL_MIB (2048): the system's share is part of the simulated host", value: "2049" },
    ])
    // The default share (1024 MiB) beside a smaller host: said so.
    const byDefault = await errorOf({ ...fixed, ENGRAM_SIM_TOTAL_MIB: "512" })
    expect(byDefault?.message).toBe(
      "invalid host agent configuration:\n  ENGRAM_SIM_OS_MIB: must be at most ENGRAM_SIM_TOTAL_MIB (512): the system's share is part of the simulated host (unset, it is 1024)",
    )
    expect((await Effect.runPromise(fromEnvironment({ ...fixed, ENGRAM_SIM_TOTAL_MIB: "2048", ENGRAM_SIM_OS_MIB: "2048" }))).hostId).toBe("h1")
  })

  it("each size has an upper bound (a slip of digits is refused naming the variable and the rule, never taken); the bounds are taken", async () => {
    const fixed = { ...required, ENGRAM_AGENT_MEASURE: "fixed" }
    const over = await errorOf({ ...fixed, ENGRAM_SIM_TOTAL_MIB: "999999999999999", ENGRAM_SIM_OS_MIB: "16777217", ENGRAM_SIM_VCPUS: "4097" })
    expect(over?.issues).toEqual([
      { variable: "ENGRAM_SIM_TOTAL_MIB", rule: "must be an integer from 1 to 16777216 (16 TiB: more than one host holds)", value: "999999999999999" },
      { variable: "ENGRAM_SIM_OS_MIB", rule: "must be an integer from 0 to 16777216 (16 TiB: more than one host holds)", value: "16777217" },
      { variable: "ENGRAM_SIM_VCPUS", rule: "must be an integer from 1 to 4096 (more than one host has)", value: "4097" },
    ])
    const edge = await Effect.runPromise(fromEnvironment({ ...fixed, ENGRAM_SIM_TOTAL_MIB: "16777216", ENGRAM_SIM_OS_MIB: "16777216", ENGRAM_SIM_VCPUS: "4096" }))
    expect(edge.hostId).toBe("h1")
  })

  it("a size set while the host is measured from /proc (unused there) is refused naming it and the rule, each one, all at once, as ENGRAM_SIM is outside ENGRAM_RUNTIME=sim; with the QEMU runtime and fixed sizes they apply", async () => {
    const proc = await errorOf({ ...required, ENGRAM_SIM_TOTAL_MIB: "256", ENGRAM_SIM_OS_MIB: "0", ENGRAM_SIM_VCPUS: "2", ENGRAM_AGENT_PORT: "seven" })
    expect(proc?.message).toBe(
      [
        "invalid host agent configuration:",
        '  ENGRAM_AGENT_PORT="seven": must be an integer from 0 to 65535 (a TCP port; 0 takes any free one)',
        '  ENGRAM_SIM_TOTAL_MIB="256": applies only with ENGRAM_AGENT_MEASURE=fixed',
        '  ENGRAM_SIM_OS_MIB="0": applies only with ENGRAM_AGENT_MEASURE=fixed',
        '  ENGRAM_SIM_VCPUS="2": applies only with ENGRAM_AGENT_MEASURE=fixed',
      ].join("\n"),
    )
    expect((await errorOf({ ...required, ENGRAM_AGENT_MEASURE: "proc", ENGRAM_SIM_VCPUS: "2" }))?.issues).toEqual([
      { variable: "ENGRAM_SIM_VCPUS", rule: "applies only with ENGRAM_AGENT_MEASURE=fixed", value: "2" },
    ])
    // Empty is unset; a bad measure is judged by its own rule alone.
    expect((await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_SIM_TOTAL_MIB: "" }))).hostId).toBe("h1")
    expect((await errorOf({ ...required, ENGRAM_AGENT_MEASURE: "guess", ENGRAM_SIM_TOTAL_MIB: "256" }))?.issues.map((i) => i.variable)).toEqual(["ENGRAM_AGENT_MEASURE"])
    const qemu = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_RUNTIME: "qemu", ENGRAM_QEMU_KERNEL: "/k", ENGRAM_AGENT_MEASURE: "fixed", ENGRAM_SIM_TOTAL_MIB: "256", ENGRAM_SIM_OS_MIB: "0" }))
    expect(await Effect.runPromise(qemu.measure(0))).toMatchObject({ totalMib: 256 })
  })
})

describe("the advertised peer URL (ENGRAM_AGENT_PEER_URL, a program's peerUrl)", () => {
  const peerRule = PeerLink.peerUrlRule

  it("from the environment: given, it is the option as set; unset or empty, none is given and the advertise host rides with the listen address", async () => {
    const given = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_PEER_URL: "https://agent-1.internal:8443/engram" }))
    expect(given.peerUrl).toBe("https://agent-1.internal:8443/engram")
    for (const env of [required, { ...required, ENGRAM_AGENT_PEER_URL: "" }]) {
      const o = await Effect.runPromise(fromEnvironment(env))
      expect(o.peerUrl).toBeUndefined()
      expect(o.listen).toEqual({ port: 7100, host: "127.0.0.1" })
    }
    const advertised = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_HOST: "0.0.0.0", ENGRAM_AGENT_PORT: "7200", ENGRAM_AGENT_ADVERTISE_HOST: "10.0.0.7" }))
    expect(advertised.listen).toEqual({ port: 7200, host: "0.0.0.0", advertiseHost: "10.0.0.7" })
  })

  it("from the environment: a bad one is refused naming ENGRAM_AGENT_PEER_URL and the rule, beside the other problems", async () => {
    for (const bad of ["10.0.0.1:7100", "ftp://10.0.0.1/", "http://user:pw@10.0.0.1:7100", "http://10.0.0.1:7100/?x=1", "http://10.0.0.1:7100/#x", "http://0.0.0.0:7100", "http://[::]:7100", " http://10.0.0.1:7100", "http://10.0.0.1:7100/\u0001"]) {
      const error = await errorOf({ ...required, ENGRAM_AGENT_PEER_URL: bad, ENGRAM_AGENT_PORT: "seven" })
      expect(error?.issues.map((i) => [i.variable, i.rule]), bad).toEqual([
        ["ENGRAM_AGENT_PORT", "must be an integer from 0 to 65535 (a TCP port; 0 takes any free one)"],
        ["ENGRAM_AGENT_PEER_URL", peerRule],
      ])
    }
  })

  it("ENGRAM_AGENT_ADVERTISE_HOST and ENGRAM_AGENT_MIGRATION_HOST are one host each (a name or an IP address, IPv6 without brackets), the advertised one not a wildcard however spelt; anything else is refused naming the variable and the rule, all at once", async () => {
    const advertiseRule = PeerLink.advertiseHostRule
    const listenRule = PeerLink.listenHostRule
    const notOneHost = ["http://10.0.0.1", "10.0.0.1:7100", "10.0.0.1/x", "host b", "host-b\n", "[::1]", "user@10.0.0.1", "h?x", "h#x", "h\\x", "a\u0001b"]
    for (const bad of [...notOneHost, "0.0.0.0", "::", "0", "0:0::0", "::ffff:0.0.0.0"]) {
      const error = await errorOf({ ...required, ENGRAM_AGENT_ADVERTISE_HOST: bad })
      expect(error?.message, JSON.stringify(bad)).toBe(["invalid host agent configuration:", `  ENGRAM_AGENT_ADVERTISE_HOST=${JSON.stringify(bad)}: ${advertiseRule}`].join("\n"))
    }
    for (const bad of notOneHost) {
      const error = await errorOf({ ...required, ENGRAM_AGENT_MIGRATION_HOST: bad })
      expect(error?.issues, JSON.stringify(bad)).toEqual([{ variable: "ENGRAM_AGENT_MIGRATION_HOST", rule: listenRule, value: bad }])
      // The agent's own listen host by the same rule (it is written into its peer URL).
      const listen = await errorOf({ ...required, ENGRAM_AGENT_HOST: bad })
      expect(listen?.issues, JSON.stringify(bad)).toEqual([{ variable: "ENGRAM_AGENT_HOST", rule: listenRule, value: bad }])
    }
    // Both, beside another problem: every one at once.
    const both = await errorOf({ ...required, ENGRAM_AGENT_PORT: "seven", ENGRAM_AGENT_MIGRATION_HOST: "tcp://0.0.0.0:4444", ENGRAM_AGENT_ADVERTISE_HOST: "0.0.0.0" })
    expect(both?.issues.map((i) => i.variable)).toEqual(["ENGRAM_AGENT_PORT", "ENGRAM_AGENT_MIGRATION_HOST", "ENGRAM_AGENT_ADVERTISE_HOST"])
    // A name, an IPv4 or an IPv6 address; the data plane may listen on a wildcard; empty is unset.
    for (const [migrationHost, advertiseHost] of [["0.0.0.0", "host-b.internal"], ["::", "fd00::7"], ["10.0.0.7", "10.0.0.7"], ["::1", "::1"], ["localhost", "Host-B.example.com."]]) {
      const o = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_MIGRATION_HOST: migrationHost, ENGRAM_AGENT_ADVERTISE_HOST: advertiseHost }))
      expect(o.migration, migrationHost).toEqual({ listenHost: migrationHost, advertiseHost })
    }
    const unset = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_AGENT_MIGRATION_HOST: "", ENGRAM_AGENT_ADVERTISE_HOST: "" }))
    expect(unset.migration).toEqual({ listenHost: "127.0.0.1" })
  })

  it("a program's: checked with the same rule, named peerUrl, beside the other issues; null (none) and a good URL are accepted", async () => {
    const issuesOf = async (o: Parameters<typeof checkedConfig>[0]) => {
      const exit = await Effect.runPromiseExit(checkedConfig(o))
      const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: Env.ConfigInvalid }).error : undefined
      return error?.issues.map((i) => [i.variable, i.rule, i.value])
    }
    expect(await issuesOf({ hostId: "h", peerUrl: "http://u:p@h:1", config: { reportIntervalMs: 0 } })).toEqual([
      // Its value never echoed when it may hold user:password@.
      ["peerUrl", peerRule, "<hidden>"],
      ["config.reportIntervalMs", "must be an integer >= 1", 0],
    ])
    expect(await issuesOf({ hostId: "h", peerUrl: 7100 } as unknown as Parameters<typeof checkedConfig>[0])).toEqual([["peerUrl", "must be a string or null", 7100]])
    for (const peerUrl of [null, "http://10.0.0.1:7100", "https://[fd00::1]:8443/a/"]) expect(await issuesOf({ hostId: "h", peerUrl })).toBeUndefined()
  })

  it("derived when not given: http://<listen host, or the advertise host when it listens on a wildcard>:<port>; none for a wildcard host", () => {
    expect(PeerLink.peerHostOf("10.0.0.1", "10.0.0.9")).toBe("10.0.0.1")
    expect(PeerLink.peerHostOf("0.0.0.0", "10.0.0.9")).toBe("10.0.0.9")
    expect(PeerLink.peerHostOf("::", undefined)).toBe("::")
    expect(PeerLink.derivedPeerUrl("10.0.0.7", 7100)).toBe("http://10.0.0.7:7100")
    expect(PeerLink.derivedPeerUrl("agent-1.internal", 1)).toBe("http://agent-1.internal:1")
    expect(PeerLink.derivedPeerUrl("fd00::1", 7100)).toBe("http://[fd00::1]:7100")
    expect(PeerLink.derivedPeerUrl("[fd00::1]", 7100)).toBe("http://[fd00::1]:7100")
    for (const wildcard of ["0.0.0.0", "::", "[::]"]) expect(PeerLink.derivedPeerUrl(wildcard, 7100)).toBeNull()
    // What is derived passes the rule it is checked by when given.
    expect(PeerLink.peerUrlProblem(PeerLink.derivedPeerUrl("fd00::1", 7100)!)).toBeUndefined()
  })

  it("a started agent reports the URL it advertises: given, derived from the bound port and the listen host (the advertise host when it listens on a wildcard), none for a wildcard or without a server", async () => {
    const reported = (o: StartOptions) => reportedBy(o)
    const local = await reported({ listen: { port: 0, host: "127.0.0.1" } })
    expect(local.peerUrl).toBe(`http://127.0.0.1:${local.port}`)
    const behind = await reported({ listen: { port: 0, host: "0.0.0.0", advertiseHost: "agent-1.internal" } })
    expect(behind.peerUrl).toBe(`http://agent-1.internal:${behind.port}`)
    expect(await reported({ listen: { port: 0, host: "0.0.0.0" } })).toMatchObject({ peerUrl: null, hasKey: false })
    expect((await reported({})).peerUrl).toBeNull()
    // The peer server listens on a host of its own: the URL names it, whatever the data plane's advertise host.
    const pinned = await reported({ listen: { port: 0, host: "127.0.0.1", advertiseHost: "10.0.0.9" } })
    expect(pinned.peerUrl).toBe(`http://127.0.0.1:${pinned.port}`)
    // An advertise host no URL can hold (a space): none advertised, rather than a report refused.
    expect((await reported({ listen: { port: 0, host: "0.0.0.0", advertiseHost: "bad host" } })).peerUrl).toBeNull()
    expect((await reported({ listen: { port: 0, host: "0.0.0.0" }, peerUrl: "http://10.0.0.7:7100" })).peerUrl).toBe("http://10.0.0.7:7100")
    expect((await reported({ listen: { port: 0, host: "127.0.0.1" }, peerUrl: null })).peerUrl).toBeNull()
  })

  it("told none, a started agent advertises its own ENGRAM_PEERS entry before deriving one; a URL it is told comes first; an own entry that breaks the rule is not advertised", async () => {
    const warnings: string[] = []
    const capture = Logger.layer([Logger.make(({ logLevel, message }) => void (logLevel === "Warn" && warnings.push(String(Array.isArray(message) ? message[0] : message))))])
    const reported = (o: StartOptions) => reportedBy(o, capture)
    const list = (entries: Record<string, string>) => (id: string) => entries[id]
    const own = list({ h: "http://10.0.0.7:7100", h2: "http://10.0.0.8:7100" })
    // An ENGRAM_PEERS-only fleet on wildcard listen hosts: each agent advertises its entry (a move target).
    expect((await reported({ listen: { port: 0, host: "0.0.0.0" }, peers: own })).peerUrl).toBe("http://10.0.0.7:7100")
    // It comes before the derived URL, and after ENGRAM_AGENT_PEER_URL (or a program's null).
    expect((await reported({ listen: { port: 0, host: "127.0.0.1" }, peers: own })).peerUrl).toBe("http://10.0.0.7:7100")
    expect((await reported({ listen: { port: 0, host: "0.0.0.0" }, peers: own, peerUrl: "https://agent-h.internal:8443" })).peerUrl).toBe("https://agent-h.internal:8443")
    expect((await reported({ listen: { port: 0, host: "0.0.0.0" }, peers: own, peerUrl: null })).peerUrl).toBeNull()
    // Only its own entry: another host's is never advertised.
    expect((await reported({ listen: { port: 0, host: "0.0.0.0" }, peers: list({ h2: "http://10.0.0.8:7100" }) })).peerUrl).toBeNull()
    const derived = await reported({ listen: { port: 0, host: "127.0.0.1" }, peers: list({ h2: "http://10.0.0.8:7100" }) })
    expect(derived.peerUrl).toBe(`http://127.0.0.1:${derived.port}`)
    // An own entry that breaks the rule (a wildcard host, none at all): the derived URL, as without it.
    for (const bad of ["http://0.0.0.0:7100", "10.0.0.7:7100", ""]) {
      const r = await reported({ listen: { port: 0, host: "127.0.0.1" }, peers: list({ h: bad }) })
      expect(r.peerUrl, bad).toBe(`http://127.0.0.1:${r.port}`)
      expect((await reported({ listen: { port: 0, host: "0.0.0.0" }, peers: list({ h: bad }) })).peerUrl, bad).toBeNull()
    }
    // Such an entry is named once at start, with what the agent advertises instead.
    warnings.length = 0
    const instead = await reported({ listen: { port: 0, host: "127.0.0.1" }, peers: list({ h: "http://0.0.0.0:7100" }) })
    expect(warnings).toHaveLength(1)
    expect(warnings[0]).toMatch(/^this host's ENGRAM_PEERS entry is not advertised as its peer URL: it .+; this agent advertises http:\/\/127\.0\.0\.1:\d+ instead$/)
    expect(warnings[0]).toContain(`http://127.0.0.1:${instead.port}`)
    warnings.length = 0
    await reported({ listen: { port: 0, host: "0.0.0.0" }, peers: list({ h: "http://0.0.0.0:7100" }) })
    expect(warnings).toEqual([expect.stringMatching(/; this agent advertises no peer URL, so the coordinator's reaper moves no session here to make room\. Mend the entry or set ENGRAM_AGENT_PEER_URL$/)])
    // No peer server (a program's agent without \`listen\`): nothing listens at its entry either, so none is advertised.
    expect((await reported({ peers: own })).peerUrl).toBeNull()
    expect((await reported({ peers: own, peerUrl: "http://10.0.0.7:7100" })).peerUrl).toBe("http://10.0.0.7:7100")
  })
})

describe("the agent's settings refuse what would leak or stall (the security review)", () => {
  const issuesOf = async (env: Record<string, string>) => (await errorOf({ ...required, ...env }))?.issues.map((i) => [i.variable, i.rule, i.value])

  it("a URL setting's user:password@ is never echoed: ENGRAM_AGENT_PEER_URL and a program's peerUrl show <hidden>, ENGRAM_PEERS its URLs masked", async () => {
    const peerUrl = await errorOf({ ...required, ENGRAM_AGENT_PEER_URL: "http://user:hunter2@x:1" })
    expect(peerUrl?.issues).toEqual([{ variable: "ENGRAM_AGENT_PEER_URL", rule: PeerLink.peerUrlRule, value: "<hidden>" }])
    expect(peerUrl?.message).not.toContain("hunter2")
    // Not an http URL: the rule's own echo of the URL hides it too.
    const peers = await errorOf({ ...required, ENGRAM_PEERS: "a=ftp://user:hunter2@x" })
    expect(peers?.issues).toEqual([{ variable: "ENGRAM_PEERS", rule: 'host a\'s URL must be an absolute http:// or https:// URL; "<hidden>" is not', value: "<hidden>" }])
    expect(peers?.message).not.toContain("hunter2")
    for (const part of ["http://user:hunter2@x", "user:hunter2@x=http://10.0.0.2:7100"]) {
      const error = await errorOf({ ...required, ENGRAM_PEERS: part })
      expect(error?.issues, part).toHaveLength(1)
      expect(error?.message, part).not.toContain("hunter2")
    }
    const exit = await Effect.runPromiseExit(checkedConfig({ hostId: "h", peerUrl: "http://user:hunter2@x:1" }))
    const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: Env.ConfigInvalid }).error : undefined
    expect(error?.issues).toEqual([{ variable: "peerUrl", rule: PeerLink.peerUrlRule, value: "<hidden>" }])
    expect(error?.message).not.toContain("hunter2")
  })

  it("an ENGRAM_PEERS entry with user:password@, a query or a fragment is refused at start naming its host and the rule (fetch refuses credentials in a URL, and peer URLs are logged)", async () => {
    const credentials = "(the agents' requests refuse a URL with credentials, and peer URLs are logged)"
    for (const [peers, rule, shown] of [
      ["h2=http://user:hunter2@10.0.0.2:7100", `host h2's URL must be without user:password@ ${credentials}; "http://***@10.0.0.2:7100" has it`, "<hidden>"],
      ["h2=http://10.0.0.2:7100,h1=http://agent@10.0.0.1:7100", `host h1's URL must be without user:password@ ${credentials}; "http://***@10.0.0.1:7100" has it`, "<hidden>"],
      ["h2=http://10.0.0.2:7100/?token=hunter2", 'host h2\'s URL must be without a query or fragment (peer URLs are logged); "http://10.0.0.2:7100/?***" has one', "h2=http://10.0.0.2:7100/?***"],
      ["h2=http://10.0.0.2:7100?", 'host h2\'s URL must be without a query or fragment (peer URLs are logged); "http://10.0.0.2:7100?***" has one', "h2=http://10.0.0.2:7100?***"],
      ["h2=http://10.0.0.2:7100/#hunter2", 'host h2\'s URL must be without a query or fragment (peer URLs are logged); "http://10.0.0.2:7100/#***" has one', "h2=http://10.0.0.2:7100/#***"],
    ] as const) {
      expect(await issuesOf({ ENGRAM_PEERS: peers }), peers).toEqual([["ENGRAM_PEERS", rule, shown]])
      expect((await errorOf({ ...required, ENGRAM_PEERS: peers }))?.message, peers).not.toContain("hunter2")
    }
    const o = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_PEERS: "h2=http://10.0.0.2:7100/engram,h3=https://agent-3.internal:8443" }))
    expect([o.peers("h2"), o.peers("h3")]).toEqual(["http://10.0.0.2:7100/engram", "https://agent-3.internal:8443"])
  })

  it("ENGRAM_HOST_TOKEN by the rule of every secret: at least 16 characters, no whitespace around it, named and never shown; a token the coordinator issues is taken", async () => {
    const rule = "must not begin or end with whitespace (a newline copied from a file: it is not the token the coordinator issued, which refuses it, and the agent exits blaming a wrong or rotated token)"
    for (const [token, broken] of [
      ["t", "must be at least 16 characters"],
      [" ".repeat(20), "must not be whitespace only"],
      ["host-token-secret-0123456789\n", rule],
      [" host-token-secret-0123456789", rule],
    ] as const) {
      const error = await errorOf({ ...required, ENGRAM_HOST_TOKEN: token })
      expect(error?.issues, JSON.stringify(token)).toEqual([{ variable: "ENGRAM_HOST_TOKEN", rule: broken, value: "<hidden>" }])
      expect(error?.message, JSON.stringify(token)).not.toContain("host-token-secret")
    }
    // What `engram hosts add` prints: the coordinator's 32 random bytes, base64url (43 characters).
    const issued = randomBytes(32).toString("base64url")
    const o = await Effect.runPromise(fromEnvironment({ ...required, ENGRAM_HOST_TOKEN: issued }))
    const token = "url" in o.coordinator ? o.coordinator.hostToken : undefined
    expect(token === undefined || typeof token === "string" ? token : Redacted.value(token)).toBe(issued)
  })

  it("the timing and count settings have generous upper bounds, each refused past it naming the variable and the rule; the bound itself is taken", async () => {
    const edges = [
      ["ENGRAM_AGENT_RETRY_MS", 1, settingBounds.retryDelayMs],
      ["ENGRAM_AGENT_STAGING_GRACE_MS", 1, settingBounds.stagingGraceMs],
      ["ENGRAM_AGENT_REPORT_RUNNING_AFTER_MS", 1, settingBounds.reportRunningAfterMs],
      ["ENGRAM_AGENT_IMAGE_GRACE_MS", 0, settingBounds.imageGraceMs],
      ["ENGRAM_AGENT_IMAGE_FETCH_DEADLINE_MS", 0, settingBounds.imageFetchDeadlineMs],
      ["ENGRAM_HEARTBEAT_STALE_WINDOW_MS", 1, settingBounds.heartbeatStaleWindowMs],
      ["ENGRAM_AGENT_MAX_PRECOPY_ROUNDS", 2, settingBounds.maxPreCopyRounds],
      ["ENGRAM_AGENT_IMAGE_FETCH_MIN_MIBPS", 1, settingBounds.mibPerSec],
    ] as const
    for (const [variable, min, bound] of edges) {
      const past = String(bound.max + 1)
      expect(await issuesOf({ [variable]: past }), variable).toEqual([[variable, `must be an integer from ${min} to ${bound.max} (${bound.why})`, past]])
      await Effect.runPromise(fromEnvironment({ ...required, [variable]: String(bound.max) }))
    }
    expect(await issuesOf({ ENGRAM_RUNTIME: "qemu", ENGRAM_QEMU_KERNEL: "/k", ENGRAM_QEMU_MOVE_MIB_S: "102401" })).toEqual([["ENGRAM_QEMU_MOVE_MIB_S", "must be an integer from 1 to 102400 (100 GiB/s)", "102401"]])
    // The review's: one failed poll would have stopped the agent's commands for 31,000 years.
    expect(await issuesOf({ ENGRAM_AGENT_RETRY_MS: "999999999999999" })).toEqual([
      ["ENGRAM_AGENT_RETRY_MS", `must be an integer from 1 to 60000 (${settingBounds.retryDelayMs.why})`, "999999999999999"],
    ])
    // A program's options by the same rules, named by key.
    const exit = await Effect.runPromiseExit(checkedConfig({ hostId: "h", config: { ...defaultAgentConfig("h"), retryDelayMs: 999_999_999_999_999, stagingGraceMs: 3_600_001 } }))
    const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: Env.ConfigInvalid }).error : undefined
    expect(error?.issues.map((i) => i.variable)).toEqual(["config.retryDelayMs", "config.stagingGraceMs"])
  })
})
