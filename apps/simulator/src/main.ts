/** The `pnpm sim` entry: runs the command line and exits with its code. */
import { Effect } from "effect"
import { main } from "./Cli.js"

const code = await Effect.runPromise(
  main(process.argv.slice(2)).pipe(
    Effect.catchTags({
      UsageError: (e) => Effect.sync(() => (process.stderr.write(`${e.option ? `${e.option}: ` : ""}${e.message}\n(see --help)\n`), 2)),
      FileError: (e) => Effect.sync(() => (process.stderr.write(`${e.path}: ${e.message}\n`), 1)),
    }),
    // effect/cli has printed the help and the parse errors already.
    Effect.catch(() => Effect.succeed(2)),
  ),
)
process.exitCode = code
