/**
 * @engram/process: how an engram process runs. `Log` logs pretty on a terminal and JSON lines
 * otherwise (`ENGRAM_LOG_FORMAT`, `ENGRAM_LOG_LEVEL`); `Main.run` runs a program as the
 * process (exit 0 on SIGINT/SIGTERM, `Fatal` errors as one line with their exit code);
 * `Explain` says a failed listen or a refused database in one line; `Pid` tells a file's owner
 * process from a later one given the same pid.
 */
export * as Env from "./Env.js"
export * as Explain from "./Explain.js"
export * as Log from "./Log.js"
export * as Main from "./Main.js"
export * as Pid from "./Pid.js"
export { Fatal } from "./Main.js"
