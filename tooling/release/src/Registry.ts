/**
 * A local npm registry for the release test: Verdaccio (from npm, this package's
 * devDependency) with its storage under a temporary directory, on a free loopback port. The
 * `@engram/*` packages are published to it and never looked for upstream; every other package
 * is fetched from the npm registry through it (the uplink), so a fresh project installs from
 * this one registry alone.
 */
import { type ChildProcess, spawn } from "node:child_process"
import { writeFileSync } from "node:fs"
import { createRequire } from "node:module"
import { dirname, join } from "node:path"
import { setTimeout as sleep } from "node:timers/promises"
import { freePort } from "@engram/test-pg"

/** A running registry: its URL (with a trailing slash) and a publisher's token. */
export interface Registry {
  readonly url: string
  readonly token: string
  /** The `.npmrc` lines that point a client at it, with the token. */
  readonly npmrc: string
  readonly stop: () => Promise<void>
}

const config = (dir: string) => `storage: ${join(dir, "storage")}
auth:
  htpasswd:
    file: ${join(dir, "htpasswd")}
    max_users: 10
uplinks:
  npmjs:
    url: https://registry.npmjs.org/
    timeout: 60s
packages:
  "@engram/*":
    access: $all
    publish: $authenticated
  "**":
    access: $all
    publish: $authenticated
    proxy: npmjs
# The CLI's package carries source maps of its bundle (tens of MB unpacked).
max_body_size: 200mb
log: { type: stdout, format: json, level: warn }
`

/** Starts Verdaccio in `dir` and adds a publisher. */
export const startRegistry = async (dir: string): Promise<Registry> => {
  writeFileSync(join(dir, "config.yaml"), config(dir))
  const port = await freePort()
  const bin = join(dirname(createRequire(import.meta.url).resolve("verdaccio/package.json")), "bin", "verdaccio")
  const child: ChildProcess = spawn(process.execPath, [bin, "-c", join(dir, "config.yaml"), "-l", `127.0.0.1:${port}`], { stdio: ["ignore", "pipe", "pipe"] })
  let log = ""
  child.stdout?.on("data", (b: Buffer) => (log += b.toString()))
  child.stderr?.on("data", (b: Buffer) => (log += b.toString()))
  const url = `http://127.0.0.1:${port}/`
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return
    const exited = new Promise((r) => child.once("exit", r))
    child.kill("SIGTERM")
    await Promise.race([exited, sleep(5000).then(() => child.kill("SIGKILL"))])
  }
  try {
    const deadline = Date.now() + 60_000
    for (;;) {
      if (child.exitCode !== null) throw new Error(`verdaccio exited with ${child.exitCode}: ${log}`)
      if (await fetch(`${url}-/ping`).then((r) => r.ok, () => false)) break
      if (Date.now() > deadline) throw new Error(`verdaccio did not answer on ${url} within 60 s: ${log}`)
      await sleep(250)
    }
    const added = await fetch(`${url}-/user/org.couchdb.user:release`, {
      method: "PUT",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ name: "release", password: "release-test-password" }),
    })
    const body = (await added.json()) as { token?: string }
    if (!added.ok || body.token === undefined) throw new Error(`verdaccio refused a publisher: ${added.status} ${JSON.stringify(body)}`)
    const hostPath = url.replace(/^http:/, "")
    return { url, token: body.token, npmrc: `registry=${url}\n${hostPath}:_authToken=${body.token}\n`, stop }
  } catch (e) {
    await stop()
    throw e
  }
}
