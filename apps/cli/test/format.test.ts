// The CLI's pure parts: figures for a person, the units flags accept, aligned tables, the
// no-fit summary, and where the coordinator and its token are found.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { Config } from "@engram/coordinator"
import { Cli, Format, Target, Why } from "../src/index.js"
import { engramFromSource } from "./support/Run.js"

describe("figures", () => {
  it("RAM reads in MiB below 1 GiB, in GiB and TiB above, one decimal at most", () => {
    expect([Format.mib(512), Format.mib(1024), Format.mib(1536), Format.mib(12 * 1024), Format.mib(2 * 1024 * 1024), Format.mib(null)]).toEqual([
      "512 MiB",
      "1 GiB",
      "1.5 GiB",
      "12 GiB",
      "2 TiB",
      "-",
    ])
  })

  it("flags take sizes and durations with units; anything else is refused", () => {
    expect([Format.parseMib("1024"), Format.parseMib("1GiB"), Format.parseMib("1.5g"), Format.parseMib("512MiB"), Format.parseMib("1t")]).toEqual([1024, 1024, 1536, 512, 1024 * 1024])
    expect([Format.parseMib("lots"), Format.parseMib("0"), Format.parseMib("-1g"), Format.parseMib("0.3")]).toEqual([null, null, null, null])
    // 1000-based units are refused, not read as their 1024-based namesakes.
    expect([Format.parseMib("1GB"), Format.parseMib("512mb"), Format.parseMib("1TB")]).toEqual([null, null, null])
    expect(["1", "16", " 8 ", "999999999999999"].map(Format.parseWhole)).toEqual([1, 16, 8, 999999999999999])
    expect(["1e3", "0x10", "2.0", "-1", "+1", "0", "", "1_000", "9999999999999999"].map(Format.parseWhole)).toEqual(Array(9).fill(null))
    expect([Format.parseMs("600ms"), Format.parseMs("0.5s"), Format.parseMs("600"), Format.parseMs("2m")]).toEqual([600, 500, 600, 120_000])
    expect([Format.parseMs("soon"), Format.parseMs("0ms")]).toEqual([null, null])
  })

  it("a negative figure with a unit after a long flag is joined to it; pnpm's leading -- is dropped", async () => {
    const { args } = await import("../src/Cli.js")
    expect(args(["--", "sessions", "create", "--mem", "-1GiB", "--vcpus", "-1"])).toEqual(["sessions", "create", "--mem=-1GiB", "--vcpus", "-1"])
    expect(args(["sessions", "move", "s", "--max-downtime", "-5ms", "--json"])).toEqual(["sessions", "move", "s", "--max-downtime=-5ms", "--json"])
    expect(args(["why", "--", "--mem", "-1g"])).toEqual(["why", "--", "--mem", "-1g"])
  })

  it("an event's details leave out the fields without a value", () => {
    expect(Format.details({ seq: 4, at: 1, kind: "descending", sessionId: "s", hostId: "h", cause: "idle", reason: null })).toBe("cause=idle")
    expect(Format.details({ seq: 5, at: 1, kind: "descending", sessionId: "s", hostId: "h", cause: "yield", reason: "demand" })).toBe("cause=yield reason=demand")
    expect(Format.details({ seq: 6, at: 1, kind: "ended", hostId: null })).toBe("")
  })

  it("durations read as a person says them", () => {
    expect([Format.duration(850), Format.duration(12_000), Format.duration(185_000), Format.duration(2 * 3_600_000 + 600_000), Format.duration(3 * 86_400_000 + 4 * 3_600_000)]).toEqual([
      "850 ms",
      "12s",
      "3m 05s",
      "2h 10m",
      "3d 4h",
    ])
  })

  it("a table aligns its columns and right-aligns the numeric ones", () => {
    const t = Format.table(["HOST", "FREE", "PARKS"], [["a", "512 MiB", "3"], ["longer-host", "12 GiB", "10"]])
    expect(t.split("\n")).toEqual(["HOST            FREE  PARKS", "a            512 MiB      3", "longer-host   12 GiB     10"])
  })
})

describe("why a session waits", () => {
  it("sums the hosts' reasons, most common first, and counts the hosts with room", () => {
    const noFit = [
      ...Array.from({ length: 31 }, (_, i) => ({ hostId: `r${i}`, reason: "ram_full" as const, freeMib: 0, freeVcpus: 1 })),
      ...Array.from({ length: 3 }, (_, i) => ({ hostId: `c${i}`, reason: "cordoned" as const, freeMib: 0, freeVcpus: 1 })),
      ...Array.from({ length: 6 }, (_, i) => ({ hostId: `e${i}`, reason: "entries_full" as const, freeMib: 0, freeVcpus: 1 })),
    ]
    expect(Why.summarize(noFit)).toBe("0/40 hosts have room: 31 ram_full, 6 entries_full, 3 cordoned")
    expect(Why.summarize([{ hostId: "a", reason: "fits_now", freeMib: 9, freeVcpus: 1 }])).toBe("1/1 host has room")
    expect(Why.summarize([])).toBe("0/0 hosts have room")
  })

  it("says when the park gate's parks would make room, from the hosts' reasons and the parked sessions", () => {
    const budget = { memMib: 2048, vcpus: 1 }
    const noFit = [
      { hostId: "a", reason: "ram_full" as const, freeMib: 1024, freeVcpus: 4 },
      { hostId: "b", reason: "ram_full" as const, freeMib: 0, freeVcpus: 4 },
      { hostId: "c", reason: "cordoned" as const, freeMib: 8192, freeVcpus: 4 },
    ]
    const park = (hostId: string, memMib: number) => ({ hostId, budget: { memMib, vcpus: 1 } })
    expect(Why.parksHint(budget, noFit, [park("a", 1024), park("b", 512), park("c", 4096)])).toBe(
      "Parks can make room: 2 parked sessions on full hosts; descending them would make room for it on a (the park gate makes parks yield while a session waits).",
    )
    expect(Why.parksHint(budget, noFit, [park("b", 512)])).toBe("There is 1 parked session on a full host, but its room would not hold it on any one host.")
    // No parks where room is short (a cordoned host's do not count), or a host has room now: nothing to say.
    expect(Why.parksHint(budget, noFit, [park("c", 4096)])).toBeNull()
    expect(Why.parksHint(budget, [...noFit, { hostId: "d", reason: "fits_now", freeMib: 4096, freeVcpus: 4 }], [park("a", 1024)])).toBeNull()
  })
})

describe("the target", () => {
  const dir = mkdtempSync(join(tmpdir(), "engram-target-"))
  afterAll(() => rmSync(dir, { recursive: true, force: true }))

  it("flags win over the environment, which wins over the token file", () => {
    mkdirSync(join(dir, ".engram"), { recursive: true })
    writeFileSync(join(dir, ".engram", "admin-token"), "from-file-0123456789\n")
    expect(Target.resolveTarget({ url: "http://x:1/", token: "from-flag" }, { ENGRAM_URL: "http://y:2", ENGRAM_TOKEN: "from-env" }, dir)).toEqual({
      url: "http://x:1",
      urls: ["http://x:1"],
      urlSource: "--url",
      token: "from-flag",
      tokenSource: "--token",
    })
    expect(Target.resolveTarget({ url: undefined, token: undefined }, { ENGRAM_URL: "http://y:2", ENGRAM_TOKEN: "from-env" }, dir)).toEqual({
      url: "http://y:2",
      urls: ["http://y:2"],
      urlSource: "ENGRAM_URL",
      token: "from-env",
      tokenSource: "ENGRAM_TOKEN",
    })
    expect(Target.resolveTarget({ url: undefined, token: undefined }, { ENGRAM_PORT: "7171" }, join(dir))).toEqual({
      url: "http://127.0.0.1:7171",
      urls: ["http://127.0.0.1:7171"],
      urlSource: "ENGRAM_PORT",
      token: "from-file-0123456789",
      tokenSource: join(dir, ".engram", "admin-token"),
    })
  })

  it("the token file goes only to a coordinator on this machine", () => {
    mkdirSync(join(dir, ".engram"), { recursive: true })
    writeFileSync(join(dir, ".engram", "admin-token"), "from-file-0123456789\n")
    for (const url of ["http://localhost:7070", "http://127.0.0.2:7070", "http://[::1]:7070", "http://127.0.0.1:1,http://localhost:2"])
      expect(Target.resolveTarget({ url, token: undefined }, {}, dir), url).toMatchObject({ token: "from-file-0123456789" })
    for (const url of ["http://coordinator.example.net:7070", "https://10.0.0.5:7070", "http://127.0.0.1:1,http://10.0.0.5:2", "http://127.0.0.1.example.net:7070"])
      expect(Target.resolveTarget({ url, token: undefined }, {}, dir), url).toMatchObject({ token: null, tokenSource: null })
    expect(Target.resolveTarget({ url: undefined, token: undefined }, { ENGRAM_URL: "http://coordinator.example.net:7070" }, dir)).toMatchObject({ token: null })
    // A token given for it is used.
    expect(Target.resolveTarget({ url: "http://coordinator.example.net:7070", token: "given-0123456789" }, {}, dir)).toMatchObject({ token: "given-0123456789" })
  })

  it("pnpm's INIT_CWD is searched before the working directory", () => {
    const other = join(dir, "other")
    mkdirSync(join(other, ".engram"), { recursive: true })
    writeFileSync(join(other, ".engram", "admin-token"), "other-token-0123456789\n")
    expect(Target.resolveTarget({ url: undefined, token: undefined }, { INIT_CWD: other }, dir)).toMatchObject({ tokenSource: join(other, ".engram", "admin-token") })
  })

  it("ENGRAM_DATA_DIR with whitespace around it is refused naming it, never trimmed (the coordinator refuses it too), and only where a token file is looked for; INIT_CWD is taken as pnpm wrote it", () => {
    const data = join(dir, "data")
    mkdirSync(data, { recursive: true })
    writeFileSync(join(data, "admin-token"), "data-token-0123456789\n")
    const rule = "must not begin or end with whitespace (empty is unset)"
    for (const value of [`${data}\n`, ` ${data}`, "   "]) {
      expect(Target.resolveTarget({ url: undefined, token: undefined }, { ENGRAM_DATA_DIR: value }, dir), JSON.stringify(value)).toEqual({
        problem: `ENGRAM_DATA_DIR ${JSON.stringify(value)}: ${rule}`,
      })
      // Not read when a token is given, nor for a coordinator elsewhere.
      expect(Target.resolveTarget({ url: undefined, token: "t-0123456789" }, { ENGRAM_DATA_DIR: value }, dir)).toMatchObject({ token: "t-0123456789" })
      expect(Target.resolveTarget({ url: "http://10.0.0.5:7070", token: undefined }, { ENGRAM_DATA_DIR: value }, dir)).toMatchObject({ token: null })
    }
    expect(Target.resolveTarget({ url: undefined, token: undefined }, { ENGRAM_DATA_DIR: data }, dir)).toMatchObject({ tokenSource: join(data, "admin-token") })
    // pnpm's INIT_CWD is a directory's real name, a trailing blank and all: the coordinator resolves against it as given.
    const spaced = join(dir, "spaced ")
    mkdirSync(join(spaced, ".engram"), { recursive: true })
    writeFileSync(join(spaced, ".engram", "admin-token"), "spaced-token-0123456789\n")
    expect(Target.resolveTarget({ url: undefined, token: undefined }, { INIT_CWD: spaced }, dir)).toMatchObject({ tokenSource: join(spaced, ".engram", "admin-token") })
    expect(Target.tokenFiles({ INIT_CWD: spaced, ENGRAM_DATA_DIR: "d" }, dir)[0]).toBe(join(Config.resolveDataDir("d", { INIT_CWD: spaced }), "admin-token"))
  })

  it("a URL may be a comma-separated list of replicas; one that breaks the rule is refused naming the setting", () => {
    const env = { ENGRAM_TOKEN: "t-0123456789" }
    expect(Target.resolveTarget({ url: undefined, token: undefined }, { ...env, ENGRAM_URL: "http://127.0.0.1:17181, http://127.0.0.1:17182/" }, dir)).toMatchObject({
      url: "http://127.0.0.1:17181,http://127.0.0.1:17182",
      urls: ["http://127.0.0.1:17181", "http://127.0.0.1:17182"],
    })
    const problem = (url: string, from: Record<string, string> = { ENGRAM_URL: url }) =>
      (Target.resolveTarget({ url: undefined, token: undefined }, { ...env, ...from }, dir) as Target.BadUrl).problem
    expect(problem("127.0.0.1:17181")).toBe(
      'ENGRAM_URL "127.0.0.1:17181": must be one or more absolute http:// or https:// URLs, comma-separated ("127.0.0.1:17181" is not one)',
    )
    expect(problem("localhost:7070")).toBe('ENGRAM_URL "localhost:7070": must be one or more absolute http:// or https:// URLs, comma-separated ("localhost:7070" is not one)')
    expect(problem("http://a:1,,http://b:2")).toBe('ENGRAM_URL "http://a:1,,http://b:2": must be one or more absolute http:// or https:// URLs, comma-separated, none empty')
    expect(problem("http://admin:pw@a:1")).toBe('ENGRAM_URL "http://***@a:1": must be one or more absolute http:// or https:// URLs, comma-separated, without user:password@ (the token authenticates)')
    expect((Target.resolveTarget({ url: "ftp://a", token: undefined }, env, dir) as Target.BadUrl).problem).toMatch(/^--url "ftp:\/\/a": must be one or more absolute http/)
    expect(problem("", { ENGRAM_PORT: "x" })).toBe(`ENGRAM_PORT "x": ${Target.portRule}`)
  })

  it("a URL or token with whitespace around it is refused naming where it came from, never trimmed, a token never shown; empty is unset", () => {
    const bad = (flags: { url?: string; token?: string }, env: Record<string, string>) =>
      (Target.resolveTarget({ url: flags.url, token: flags.token }, env, dir) as Target.BadSetting).problem
    const rule = "must not begin or end with whitespace (empty is unset)"
    expect(bad({ url: " http://x:1" }, {})).toBe(`--url " http://x:1": ${rule}`)
    expect(bad({}, { ENGRAM_URL: "http://x:1\n" })).toBe(`ENGRAM_URL "http://x:1\\n": ${rule}`)
    expect(bad({}, { ENGRAM_URL: "   " })).toBe(`ENGRAM_URL "   ": ${rule}`)
    expect(bad({}, { ENGRAM_URL: "http://admin:hunter2@x:1 " })).toBe(`ENGRAM_URL "http://***@x:1 ": ${rule}`)
    for (const [flags, env, source] of [
      [{ token: "token-0123456789\n" }, {}, "--token"],
      [{ token: " token-0123456789" }, { ENGRAM_TOKEN: "token-0123456789" }, "--token"],
      [{}, { ENGRAM_TOKEN: "token-0123456789 " }, "ENGRAM_TOKEN"],
      [{}, { ENGRAM_TOKEN: "\t" }, "ENGRAM_TOKEN"],
    ] as const) {
      const problem = bad(flags, { ENGRAM_URL: "http://x:1", ...env })
      expect(problem, source).toBe(`${source}: ${rule}`)
    }
    // Empty is unset; the one used decides (a bad ENGRAM_* under a flag is not read).
    expect(Target.resolveTarget({ url: "", token: "" }, { ENGRAM_URL: "http://y:2", ENGRAM_TOKEN: "t-0123456789" }, dir)).toMatchObject({ url: "http://y:2", token: "t-0123456789" })
    expect(Target.resolveTarget({ url: "http://x:1", token: "t-0123456789" }, { ENGRAM_URL: " bad", ENGRAM_TOKEN: " bad" }, dir)).toMatchObject({ url: "http://x:1", token: "t-0123456789" })
  })

  it("the token file may end in one newline (as the coordinator writes it); other whitespace around the token is refused naming the file, the token never shown", () => {
    const home = mkdtempSync(join(dir, "file-"))
    const file = join(home, ".engram", "admin-token")
    mkdirSync(join(home, ".engram"))
    const read = (text: string) => {
      writeFileSync(file, text)
      return Target.resolveTarget({ url: undefined, token: undefined }, {}, home)
    }
    for (const text of ["file-token-0123456789", "file-token-0123456789\n", "file-token-0123456789\r\n"]) expect(read(text), JSON.stringify(text)).toMatchObject({ token: "file-token-0123456789", tokenSource: file })
    for (const text of ["file-token-0123456789\n\n", " file-token-0123456789\n", "file-token-0123456789 \n", "\t\n"]) {
      expect(read(text), JSON.stringify(text)).toEqual({ problem: `the token in ${file} must not begin or end with whitespace (one trailing newline is taken)` })
    }
    // An empty file holds no token: the next one is looked for.
    expect(read("\n")).not.toMatchObject({ tokenSource: file })
  })

  it("ENGRAM_PORT is a port, 1 to 65535, read by core's Names.decimalInt as the coordinator reads it (a sign is taken), refused naming ENGRAM_PORT; it is judged only where it makes the URL", () => {
    for (const port of ["0", "65536", "7070/x", " ", " 7070", "0x1F90", "7e3", "7070.0", "-1", "-0", "++7070"]) {
      expect(Target.resolveTarget({ url: undefined, token: "t-0123456789" }, { ENGRAM_PORT: port }, dir), port).toEqual({ problem: `ENGRAM_PORT ${JSON.stringify(port)}: ${Target.portRule}` })
    }
    // The coordinator listens on 7070 for "+7070" (core's rule): the CLI finds it there.
    for (const port of ["+7070", "00000000007070"]) {
      const r = Config.parse({ ENGRAM_PORT: port })
      expect(r._tag === "Valid" && r.config.port, port).toBe(7070)
      expect(Target.resolveTarget({ url: undefined, token: "t-0123456789" }, { ENGRAM_PORT: port }, dir), port).toMatchObject({ urlSource: "ENGRAM_PORT", url: "http://127.0.0.1:7070" })
    }
    for (const port of ["1", "65535", "07070"]) expect(Target.resolveTarget({ url: undefined, token: "t-0123456789" }, { ENGRAM_PORT: port }, dir), port).toMatchObject({ urlSource: "ENGRAM_PORT", url: `http://127.0.0.1:${Number(port)}` })
    // The coordinator's ENGRAM_PORT=0 exported beside ENGRAM_URL is not the CLI's to judge.
    expect(Target.resolveTarget({ url: undefined, token: "t-0123456789" }, { ENGRAM_PORT: "0", ENGRAM_URL: "http://y:2" }, dir)).toMatchObject({ url: "http://y:2" })
  })

  it("ENGRAM_TIMEOUT_MS by core's rule for an integer read from text (as the agent's settings), above 0, not trimmed; empty is unset", () => {
    for (const raw of [" 5000", "5000\n", "0x10", "1e3", "0", "-1", "1.5", "30s", " "]) {
      expect(Cli.callTimeoutMs({ ENGRAM_TIMEOUT_MS: raw }), JSON.stringify(raw)).toBe(`ENGRAM_TIMEOUT_MS ${JSON.stringify(raw)}: must be an integer > 0 (ms)`)
    }
    expect(Cli.callTimeoutMs({ ENGRAM_TIMEOUT_MS: "5000" })).toBe(5000)
    expect(Cli.callTimeoutMs({ ENGRAM_TIMEOUT_MS: "" })).toBeUndefined()
    expect(Cli.callTimeoutMs({})).toBeUndefined()
  })
})

describe("--token", () => {
  it("--help says a token on the command line is readable by other local users and kept in shell history, and points at ENGRAM_TOKEN and the token file", async () => {
    const r = await engramFromSource(["--help"])
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout).toContain(
      "--token string    the admin token; other local users can read it in the process list, and it stays in your shell history: prefer ENGRAM_TOKEN or the token file",
    )
  })
})
