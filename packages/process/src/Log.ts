/**
 * How an engram process logs. On a terminal: one short, readable line per event
 * (`12:04:36 INFO  message  key=value …`), colored. Otherwise, or with
 * `ENGRAM_LOG_FORMAT=json`: one JSON object per line (`{time, level, msg, …fields}`), for a
 * log collector. `ENGRAM_LOG_LEVEL` sets the minimum level (default `info`). Every line goes
 * to stdout.
 */
import type * as Env from "./Env.js"
import { Cause, Layer, Logger, References } from "effect"
import type { LogLevel } from "effect"

/** The two formats. */
export type Format = "pretty" | "json"

/** How to log. */
export interface Settings {
  readonly format: Format
  readonly level: LogLevel.LogLevel
  /** Colors in the pretty format (a terminal that is not `NO_COLOR`). */
  readonly colors: boolean
}

const levels: Readonly<Record<string, LogLevel.LogLevel>> = {
  all: "All",
  trace: "Trace",
  debug: "Debug",
  info: "Info",
  warn: "Warn",
  warning: "Warn",
  error: "Error",
  fatal: "Fatal",
  none: "None",
}

/** The words `ENGRAM_LOG_LEVEL` takes. */
export const levelWords = ["trace", "debug", "info", "warn", "error", "fatal", "none"] as const

/**
 * The settings from the environment: `ENGRAM_LOG_FORMAT` (`pretty` | `json`; default pretty
 * on a terminal, json otherwise) and `ENGRAM_LOG_LEVEL`. A bad value is an issue, named with
 * its rule; the rest still applies.
 */
export const fromEnv = (
  env: Readonly<Record<string, string | undefined>>,
  isTTY: boolean,
): { readonly settings: Settings; readonly issues: readonly Env.Issue[] } => {
  const issues: Env.Issue[] = []
  const rawFormat = env["ENGRAM_LOG_FORMAT"]?.trim().toLowerCase() ?? ""
  let format: Format = isTTY ? "pretty" : "json"
  if (rawFormat === "json" || rawFormat === "pretty") format = rawFormat
  else if (rawFormat !== "") issues.push({ variable: "ENGRAM_LOG_FORMAT", rule: "must be pretty or json", value: env["ENGRAM_LOG_FORMAT"] })
  const rawLevel = env["ENGRAM_LOG_LEVEL"]?.trim().toLowerCase() ?? ""
  let level: LogLevel.LogLevel = "Info"
  if (rawLevel !== "") {
    const l = levels[rawLevel]
    if (l === undefined) issues.push({ variable: "ENGRAM_LOG_LEVEL", rule: `must be one of ${levelWords.join(", ")}`, value: env["ENGRAM_LOG_LEVEL"] })
    else level = l
  }
  const colors = format === "pretty" && isTTY && (env["NO_COLOR"] ?? "") === "" && env["TERM"] !== "dumb"
  return { settings: { format, level, colors }, issues }
}

const isPlainObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof Error)

/** The text and the fields of one log call: the strings joined, the objects merged. */
export const split = (message: unknown): { readonly text: string; readonly fields: Record<string, unknown> } => {
  const parts = Array.isArray(message) ? message : [message]
  const texts: string[] = []
  const fields: Record<string, unknown> = {}
  for (const p of parts) {
    if (isPlainObject(p)) Object.assign(fields, p)
    else if (p instanceof Error) texts.push(p.message)
    else if (p !== undefined) texts.push(typeof p === "string" ? p : JSON.stringify(p))
  }
  return { text: texts.join(" "), fields }
}

const show = (v: unknown): string => {
  if (typeof v === "string") return /^[^\s"=]+$/.test(v) ? v : JSON.stringify(v)
  if (v instanceof Error) return JSON.stringify(v.message)
  return JSON.stringify(v) ?? String(v)
}

const paint = (on: boolean, code: string, s: string) => (on ? `\u001b[${code}m${s}\u001b[0m` : s)
const levelColor: Readonly<Record<string, string>> = { Fatal: "1;31", Error: "31", Warn: "33", Info: "32", Debug: "36", Trace: "90" }
const levelName = (l: LogLevel.LogLevel) => (l === "Warn" ? "WARN" : l.toUpperCase())

/** One pretty line: `12:04:36 INFO  text  key=value …`, and a failure's cause below it. */
export const prettyLine = (o: { readonly level: LogLevel.LogLevel; readonly date: Date; readonly message: unknown; readonly annotations: Record<string, unknown>; readonly cause: string | null }, colors: boolean): string => {
  const { text, fields } = split(o.message)
  const all = { ...o.annotations, ...fields }
  const time = o.date.toTimeString().slice(0, 8)
  const kv = Object.entries(all)
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${k}=${show(v)}`)
    .join(" ")
  const head = `${paint(colors, "90", time)} ${paint(colors, levelColor[o.level] ?? "0", levelName(o.level).padEnd(5))} ${text}${kv === "" ? "" : `  ${paint(colors, "90", kv)}`}`
  return o.cause === null ? head : `${head}\n${paint(colors, "90", o.cause.replace(/^/gm, "  "))}`
}

/** One JSON line: `{time, level, msg, …fields, cause?}`. */
export const jsonLine = (o: { readonly level: LogLevel.LogLevel; readonly date: Date; readonly message: unknown; readonly annotations: Record<string, unknown>; readonly cause: string | null }): string => {
  const { text, fields } = split(o.message)
  const record: Record<string, unknown> = { time: o.date.toISOString(), level: levelName(o.level).toLowerCase(), msg: text, ...o.annotations, ...fields }
  if (o.cause !== null) record["cause"] = o.cause
  return JSON.stringify(record, (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v instanceof Error ? v.message : v))
}

/** The logger of these settings, writing to `write` (default stdout). */
export const logger = (settings: Settings, write: (line: string) => void = (line) => void process.stdout.write(`${line}\n`)) =>
  Logger.make<unknown, void>(({ message, logLevel, date, cause, fiber }) => {
    const annotations = { ...fiber.getRef(References.CurrentLogAnnotations) } as Record<string, unknown>
    const o = { level: logLevel, date, message, annotations, cause: cause.reasons.length > 0 ? Cause.pretty(cause) : null }
    write(settings.format === "json" ? jsonLine(o) : prettyLine(o, settings.colors))
  })

/** A layer that logs with these settings (replacing the default logger) at their minimum level. */
export const layer = (settings: Settings, write?: (line: string) => void): Layer.Layer<never> =>
  Layer.mergeAll(Logger.layer([logger(settings, write)]), Layer.succeed(References.MinimumLogLevel, settings.level))

/** The settings of this process's environment and stdout. */
export const settingsOfProcess = () => fromEnv(process.env, process.stdout.isTTY === true)
