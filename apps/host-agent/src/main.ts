/**
 * `pnpm --filter @engram/host-agent agent` / `node dist/main.js`: one host agent from the
 * environment (README.md lists the variables). Logs are pretty on a terminal and JSON lines
 * otherwise (`ENGRAM_LOG_FORMAT`, `ENGRAM_LOG_LEVEL`). It says "host agent ready" only once the
 * coordinator took its token; a refused token (wrong, or rotated since) ends it with one clear
 * line and exit 3; a bad setting exits 2; SIGINT/SIGTERM stop it with exit 0 (its VMs,
 * simulated ones included, are left as they are: the state file lets the next start adopt them).
 */
// First: on a Node.js older than engram supports, one line and exit 1 before anything else runs.
import "@engram/process/check-node"
import { Fatal, Main } from "@engram/process"
import { Deferred, Effect } from "effect"
import { exitOnConfigInvalid, fromEnvironment } from "./Config.js"
import * as Credential from "./Credential.js"
import { httpCoordinator, startHostAgent } from "./Host.js"

const program = fromEnvironment().pipe(
  // One line per bad variable, all at once: `ENGRAM_AGENT_PORT="x": must be an integer >= 0`.
  exitOnConfigInvalid,
  Effect.flatMap((options) =>
    Effect.scoped(
      Effect.gen(function* () {
        if (!("url" in options.coordinator)) return yield* Effect.die("the agent's main reads the coordinator's URL from the environment")
        // Named in messages as given: one URL, or the replicas' list.
        const url = typeof options.coordinator.url === "string" ? options.coordinator.url : options.coordinator.url.join(", ")
        const http = yield* httpCoordinator(options, options.coordinator.url, options.coordinator.hostToken)
        const credential = (message: string) => new Fatal({ message, exitCode: Main.exitCodes.credential })
        yield* Credential.verify(http, options.hostId, url, options.config?.retryDelayMs).pipe(Effect.mapError(credential))
        const refused = yield* Deferred.make<string>()
        // Its own checks of the options (`checkedConfig`) end the process as the environment's do: exit 2.
        const agent = yield* exitOnConfigInvalid(startHostAgent({ ...options, coordinator: Credential.guard(http, options.hostId, url, refused) }))
        // A line tests and scripts can wait for.
        // Which coordinator it talks to (replicas in the order tried): a wrong URL shows here.
        const coordinatorUrls = typeof options.coordinator.url === "string" ? [options.coordinator.url] : [...options.coordinator.url]
        yield* Effect.logInfo("host agent ready", { hostId: agent.hostId, port: agent.port, coordinatorUrls })
        return yield* Effect.fail(credential(yield* Deferred.await(refused)))
      }),
    ),
  ),
)

Main.run(program, { name: "engram host agent" })
