/**
 * `pnpm start` / `node dist/main.js`: the coordinator from the environment (see README). With
 * no configuration it keeps its state in PGlite under ./.engram and writes an admin token
 * there; "." is the directory pnpm was run from (`INIT_CWD`), so `pnpm start` at the
 * repository root uses the root's `.engram/`. Logs are pretty on a terminal and JSON lines
 * otherwise (`ENGRAM_LOG_FORMAT`, `ENGRAM_LOG_LEVEL`); SIGINT/SIGTERM stop it with exit 0; a
 * bad setting exits 2 naming every bad variable; a port in use, a refused database or a data
 * directory another coordinator holds is said in one line (exit 1).
 */
// First: on a Node.js older than engram supports, one line and exit 1 before anything else runs.
import "@engram/process/check-node"
import { Explain, Fatal, Main } from "@engram/process"
import { Cause, Context, Effect, Layer, Redacted } from "effect"
import * as Config from "./Config.js"
import type { CoordinatorConfig } from "./Config.js"
import { CoordinatorInfo, layer } from "./Coordinator.js"
import { DataDirLocked } from "./DataDirLock.js"
import { heapGrowingFlag } from "./Heap.js"
import { setFlagsFromString } from "node:v8"

// The JS heap kept within half its live set above it (`Heap.ts`), unless Node was started with a
// factor of the operator's own. Set before the coordinator allocates anything of its own.
const heapFlag = heapGrowingFlag(process.execArgv)
if (heapFlag !== null) setFlagsFromString(heapFlag)

let config: CoordinatorConfig | undefined

/** The one line for a data directory another coordinator holds. */
const lockedBy = (cause: Cause.Cause<unknown>): string | null => {
  for (const r of cause.reasons) if (Cause.isFailReason(r) && r.error instanceof DataDirLocked) return r.error.message
  return null
}

/** The message a launcher with an IPC channel gets once the coordinator listens: `{ _tag, url, port }`. */
const listeningMessageTag = "engram-coordinator-listening"

const program = Config.fromEnvironment().pipe(
  // One line per bad variable, all at once: `ENGRAM_PORT="70000": must be an integer from 0 to 65535`.
  Effect.mapError((e) => new Fatal({ message: e.message, exitCode: Main.exitCodes.configuration })),
  Effect.flatMap((c) => {
    config = c
    // Serves until stopped, or until the embedded store's engine ends on its own: then exit 1
    // (every store call would answer 503 for good), so a supervisor restarts the coordinator.
    return Effect.scoped(
      Effect.gen(function* () {
        const running = yield* Layer.build(layer({ config: c }))
        const info = Context.get(running, CoordinatorInfo)
        // A launcher (`pnpm start`) learns where it listens (with ENGRAM_PORT=0, the port the
        // kernel chose): no port picked elsewhere and bound later, which another socket may take.
        if (process.connected) process.send?.({ _tag: listeningMessageTag, url: info.url, port: info.port })
        const why = yield* info.storeLost
        return yield* new Fatal({ message: `${why}; exiting`, exitCode: Main.exitCodes.failure })
      }),
    )
  }),
)

// Started by a launcher over an IPC channel (`pnpm start`): stop when the launcher goes away,
// however it ended (a SIGKILL included), as a child in its process group would.
if (process.connected) {
  process.channel?.unref()
  process.once("disconnect", () => process.kill(process.pid, "SIGTERM"))
}

Main.run(program, {
  name: "engram coordinator",
  explain: (cause) =>
    config === undefined
      ? null
      : (lockedBy(cause) ??
        Explain.listenFailure(cause, { host: config.host, port: config.port, portVariable: "ENGRAM_PORT" }) ??
        (config.databaseUrl === null
          ? null
          : Explain.databaseFailure(cause, Redacted.value(config.databaseUrl), "ENGRAM_DATABASE_URL", {
              who: "each coordinator replica",
              count: Config.connectionsPerReplica(config.storePoolSize),
              detail: `ENGRAM_STORE_POOL_SIZE ${config.storePoolSize} for the store's pool, 1 for the lease, 1 for the change listener`,
              lowerWith: "ENGRAM_STORE_POOL_SIZE",
            }))),
})
