/**
 * `pnpm start`: the coordinator from the environment (see README). With no configuration it
 * keeps its state in PGlite under ./.engram and writes an admin token there; "." is the
 * directory pnpm was run from (`INIT_CWD`), so `pnpm start` at the repository root uses the
 * root's `.engram/`.
 */
import { NodeRuntime } from "@effect/platform-node"
import { Cause, Effect, Exit, Layer } from "effect"
import * as Config from "./Config.js"
import { layer, loggerLayer } from "./Coordinator.js"

const program = Config.fromEnvironment().pipe(
  Effect.matchEffect({
    onFailure: (e) =>
      // One line per bad variable, all at once: `ENGRAM_PORT="70000": must be an integer from 0 to 65535`.
      Effect.logError(e.message, { issues: e.issues }).pipe(
        Effect.andThen(
          Effect.sync(() => {
            process.exitCode = 2
          }),
        ),
      ),
    onSuccess: (config) =>
      Layer.launch(layer({ config })).pipe(Effect.tapCause((cause) => Effect.logError("engram coordinator stopped on an error", cause))),
  }),
  Effect.provide(loggerLayer()),
)

// A stop by SIGTERM/SIGINT is the normal end of a service: exit 0 once the finalizers ran.
NodeRuntime.runMain(program, {
  disableErrorReporting: true,
  teardown: (exit, onExit) => {
    if (Exit.isSuccess(exit)) return onExit(typeof process.exitCode === "number" ? process.exitCode : 0)
    return onExit(Cause.hasInterruptsOnly(exit.cause) ? 0 : 1)
  },
})
