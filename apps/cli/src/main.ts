#!/usr/bin/env node
/**
 * The `engram` command line (bin/engram.js loads this file's build, `dist/main.js`; so does
 * `pnpm engram -- <args>` at the repository root). Exit codes: 0 done, 1 the coordinator refused or could not be reached (one
 * line on stderr), 2 a usage error (the line says which flag or argument). Ctrl-C ends
 * `watch` with 0.
 */
// First: on a Node.js older than engram supports, one line and exit 1 before anything else runs.
import "@engram/process/check-node"
import * as NodeRuntime from "@effect/platform-node/NodeRuntime"
import * as NodeServices from "@effect/platform-node/NodeServices"
import { Cause, Effect, Exit } from "effect"
import { run } from "./Cli.js"

const fail = (message: string, code: number) =>
  Effect.sync(() => {
    process.stderr.write(`engram: ${message}\n`)
    process.exitCode = code
  })

const program = run(process.argv.slice(2)).pipe(
  Effect.catchTags({
    UsageError: (e) => fail(e.message, 2),
    CallFailed: (e) => fail(e.message, 1),
  }),
  // effect/cli has printed the parse error and the help already.
  Effect.catch(() => Effect.sync(() => void (process.exitCode = 2))),
  Effect.provide(NodeServices.layer),
)

NodeRuntime.runMain(program, {
  disableErrorReporting: true,
  teardown: (exit, onExit) => {
    if (Exit.isSuccess(exit) || Cause.hasInterruptsOnly(exit.cause)) return onExit(typeof process.exitCode === "number" ? process.exitCode : 0)
    process.stderr.write(`engram: ${Cause.pretty(exit.cause)}\n`)
    return onExit(1)
  },
})
