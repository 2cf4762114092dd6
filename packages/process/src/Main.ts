/**
 * An engram program as a process: logs set up from the environment (`Log`), SIGINT and
 * SIGTERM end it with exit 0 once its finalizers ran, a `Fatal` error ends it with its own
 * exit code and one clear line, and any other failure with exit 1 and its cause.
 */
import { NodeRuntime } from "@effect/platform-node"
import * as Env from "./Env.js"
import { Cause, Data, Effect, Exit } from "effect"
import * as Explain from "./Explain.js"
import * as Log from "./Log.js"

/** A failure the program has already explained: `message` is logged as one line, the process exits with `exitCode`. */
export class Fatal extends Data.TaggedError("Fatal")<{ readonly message: string; readonly exitCode: number }> {}

/** Exit codes: 2 for configuration, 3 for a refused credential, 1 for anything else. */
export const exitCodes = { failure: 1, configuration: 2, credential: 3 } as const

/** What to do with a cause before the generic report: a line that explains it, or null. */
export type Explainer = (cause: Cause.Cause<unknown>) => string | null

/** Runs `program` as this process's main program (see the module header). */
export const run = <A, E>(program: Effect.Effect<A, E>, options: { readonly name: string; readonly explain?: Explainer | undefined } = { name: "engram" }): void => {
  const { settings, issues } = Log.settingsOfProcess()
  const logged = Effect.gen(function* () {
    if (issues.length > 0) {
      // The log settings are themselves settings: refuse them the same way, all at once.
      return yield* new Fatal({ message: new Env.ConfigInvalid({ component: options.name, issues }).message, exitCode: exitCodes.configuration })
    }
    return yield* program
  }).pipe(
    Effect.catchCause((cause) =>
      Effect.gen(function* () {
        if (Cause.hasInterruptsOnly(cause)) return
        const fatal = cause.reasons.find((r): r is Cause.Fail<Fatal> => Cause.isFailReason(r) && r.error instanceof Fatal)
        if (fatal !== undefined) {
          yield* Effect.logFatal(fatal.error.message)
          process.exitCode = fatal.error.exitCode
          return
        }
        const explained = options.explain?.(cause) ?? null
        if (explained !== null) yield* Effect.logFatal(`${options.name}: ${explained}`)
        else yield* Effect.logFatal(`${options.name} stopped: ${Explain.oneLine(cause)}`).pipe(Effect.andThen(Effect.logDebug("the cause", cause)))
        process.exitCode = exitCodes.failure
      }),
    ),
    // A stop by signal: one closing line once the program's finalizers ran (its open work
    // answered, its leases given up), so an operator reading the log knows it ended cleanly.
    Effect.onInterrupt(() => Effect.logInfo(`${options.name} stopped`)),
    Effect.provide(Log.layer(settings)),
  )
  NodeRuntime.runMain(logged, {
    disableErrorReporting: true,
    // A stop by SIGINT/SIGTERM is the normal end of a service: exit 0 once the finalizers ran.
    teardown: (exit, onExit) => {
      if (Exit.isSuccess(exit)) return onExit(typeof process.exitCode === "number" ? process.exitCode : 0)
      return onExit(Cause.hasInterruptsOnly(exit.cause) ? (typeof process.exitCode === "number" ? process.exitCode : 0) : exitCodes.failure)
    },
  })
}
