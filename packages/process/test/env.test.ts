// Settings: every refusal at once in one format, secrets hidden, unknown variables named.
import { Env } from "@engram/process"
import { Config, ConfigProvider, Effect, Exit, Schema } from "effect"
import { describe, expect, it } from "vitest"

const port = Config.schema(Schema.NumberFromString.check(Schema.isInt({ message: "must be an integer" })), "ENGRAM_PORT").pipe(Config.withDefault(7070))
const token = Config.Redacted("ENGRAM_ADMIN_TOKEN")
const source = (env: Record<string, string>): Env.Source => ({
  provider: ConfigProvider.fromEnvRecord(env),
  raw: (v) => env[v],
  secrets: new Set(["ENGRAM_ADMIN_TOKEN"]),
})

describe("Env.read", () => {
  it("answers every config, defaults included", async () => {
    const r = await Effect.runPromise(Env.read("test", { port, token }, source({ ENGRAM_ADMIN_TOKEN: "s3cret-s3cret-s3cret" })))
    expect(r.port).toBe(7070)
  })

  it("reports every problem at once, naming the variable and the rule; a secret's value is hidden", async () => {
    const longToken = Config.schema(Schema.String.check(Schema.isMinLength(16, { message: "must be at least 16 characters" })), "ENGRAM_ADMIN_TOKEN")
    const required = Config.String("ENGRAM_HOST_ID")
    const exit = await Effect.runPromiseExit(Env.read("test", { port, longToken, required }, source({ ENGRAM_PORT: "soon", ENGRAM_ADMIN_TOKEN: "short" })))
    expect(Exit.isFailure(exit)).toBe(true)
    const error = Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: Env.ConfigInvalid }).error : undefined
    expect(error?.issues).toEqual([
      { variable: "ENGRAM_PORT", rule: "must be an integer", value: "soon" },
      { variable: "ENGRAM_ADMIN_TOKEN", rule: "must be at least 16 characters", value: "<hidden>" },
      { variable: "ENGRAM_HOST_ID", rule: "is required" },
    ])
    expect(error?.message).toBe(
      'invalid test configuration:\n  ENGRAM_PORT="soon": must be an integer\n  ENGRAM_ADMIN_TOKEN="<hidden>": must be at least 16 characters\n  ENGRAM_HOST_ID: is required',
    )
    expect(error?.message).not.toContain("short")
  })
})

describe("Env.secretProblem", () => {
  it("refuses a secret shorter than 16 characters, of whitespace only, or with whitespace around it; whatever is around it is not echoed", () => {
    const fails = "every call fails with 401"
    expect(Env.secretProblem("short", fails)).toBe("must be at least 16 characters")
    for (const s of [" ".repeat(16), "\n".repeat(20), "\t \r\n".repeat(4)]) expect(Env.secretProblem(s, fails), JSON.stringify(s)).toBe("must not be whitespace only")
    for (const s of ["a-good-long-secret-0123\n", " a-good-long-secret-0123", "a-good-long-secret-0123\r\n", "\ufeffa-good-long-secret-0123"])
      expect(Env.secretProblem(s, fails), JSON.stringify(s)).toBe(`must not begin or end with whitespace (a newline copied from a file: ${fails})`)
    for (const s of ["a-good-long-secret-0123", "a good long secret 0123", "x".repeat(16)]) expect(Env.secretProblem(s, fails), s).toBeUndefined()
  })
})

describe("Env.unknown", () => {
  it("names ENGRAM_* variables no component reads, with the nearest known one", () => {
    expect(Env.unknown({ ENGRAM_PROT: "1", ENGRAM_PORT: "1", HOME: "/root", ENGRAM_WHATEVER_THIS_IS: "x" })).toEqual([
      { variable: "ENGRAM_PROT", didYouMean: "ENGRAM_PORT" },
      { variable: "ENGRAM_WHATEVER_THIS_IS", didYouMean: null },
    ])
    expect(Env.unknownMessage({ variable: "ENGRAM_PROT", didYouMean: "ENGRAM_PORT" })).toBe(
      "ENGRAM_PROT is not a setting of any engram component and is ignored (did you mean ENGRAM_PORT?)",
    )
  })
})
