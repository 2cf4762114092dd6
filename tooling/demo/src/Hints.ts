/**
 * What a person must set in another terminal (at the repository root) for `pnpm engram` to find
 * the demo's coordinator and its admin token. The CLI's defaults are `http://127.0.0.1:7070`
 * (`ENGRAM_URL`) and `.engram/admin-token` found from the working directory up: after
 * `ENGRAM_PORT=17171 pnpm start` the URL must be given, and a token kept elsewhere (or given in
 * `ENGRAM_ADMIN_TOKEN`) too. Pure.
 */

/** The CLI's default coordinator URL (apps/cli's Target.defaultUrl without `ENGRAM_PORT`). */
export const cliDefaultUrl = "http://127.0.0.1:7070"

/** The `NAME=value` settings the CLI needs, in order; none when the defaults find the demo. */
export const cliSettings = (o: {
  readonly coordinatorUrl: string
  /** The admin-token file the coordinator writes, as shown to a person. */
  readonly tokenFile: string
  /** The file the CLI finds by itself: `.engram/admin-token` where `pnpm start` ran, as shown. */
  readonly cliTokenFile: string
  /** Whether the admin token was given in `ENGRAM_ADMIN_TOKEN` (the CLI reads `ENGRAM_TOKEN`). */
  readonly adminFromEnv: boolean
}): readonly string[] => [
  ...(o.coordinatorUrl.replace(/\/+$/, "") === cliDefaultUrl ? [] : [`ENGRAM_URL=${o.coordinatorUrl}`]),
  ...(o.adminFromEnv ? ['ENGRAM_TOKEN="$ENGRAM_ADMIN_TOKEN"'] : o.tokenFile === o.cliTokenFile ? [] : [`ENGRAM_TOKEN="$(cat ${o.tokenFile})"`]),
]

/** The CLI command as a person runs it in another terminal: `ENGRAM_URL=… pnpm engram -- status`. */
export const cliCommand = (settings: readonly string[], args: string): string => [...settings, `pnpm engram -- ${args}`].join(" ")
