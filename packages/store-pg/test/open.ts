// A store on a PostgreSQL URL for a test, with its own scope, closed by `close`.
import { Effect, Exit, Scope } from "effect"
import { StorePg } from "../src/index.js"

export const openUrl = (url: string, options: Omit<StorePg.PgOptions, "url"> = {}) =>
  Effect.runPromise(
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      const pair = yield* Scope.provide(StorePg.openUrl({ url, ...options }), scope)
      return { pair, close: () => Effect.runPromise(Scope.close(scope, Exit.void)) }
    }),
  )
