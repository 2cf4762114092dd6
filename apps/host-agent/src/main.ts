/**
 * `tsx src/main.ts`: one host agent from the environment (README.md lists the variables).
 * Logs JSON lines; SIGINT/SIGTERM stop it (its VMs, simulated ones included, are left as
 * they are: the state file lets the next start adopt them).
 */
import { NodeRuntime } from "@effect/platform-node"
import { Effect, Logger } from "effect"
import { fromEnvironment } from "./Config.js"
import { startHostAgent } from "./Host.js"

const program = fromEnvironment().pipe(
  Effect.matchEffect({
    // One line per bad variable, all at once: `ENGRAM_AGENT_PORT="x": must be an integer >= 0`.
    onFailure: (e) => Effect.logError(e.message, { issues: e.issues }).pipe(Effect.andThen(Effect.sync(() => void (process.exitCode = 2)))),
    onSuccess: (options) =>
      Effect.scoped(
        Effect.gen(function* () {
          const agent = yield* startHostAgent(options)
          // A line tests and scripts can wait for.
          yield* Effect.logInfo("host agent ready", { hostId: agent.hostId, port: agent.port })
          return yield* Effect.never
        }),
      ),
  }),
  Effect.provide(Logger.layer([Logger.consoleJson])),
)

NodeRuntime.runMain(program, { disableErrorReporting: true })
