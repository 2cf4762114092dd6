// What the demo's closing lines tell a person to set for `pnpm engram` in another terminal.
import { describe, expect, it } from "vitest"
import { cliCommand, cliSettings } from "../src/Hints.js"

const defaults = { coordinatorUrl: "http://127.0.0.1:7070", tokenFile: ".engram/admin-token", cliTokenFile: ".engram/admin-token", adminFromEnv: false }

describe("the CLI line the demo prints", () => {
  it("is the bare command on the CLI's defaults", () => {
    expect(cliCommand(cliSettings(defaults), "status")).toBe("pnpm engram -- status")
  })

  it("names the coordinator's URL when the port is not the default (ENGRAM_PORT=17171 pnpm start)", () => {
    expect(cliCommand(cliSettings({ ...defaults, coordinatorUrl: "http://127.0.0.1:17171" }), "status")).toBe("ENGRAM_URL=http://127.0.0.1:17171 pnpm engram -- status")
  })

  it("names the token when the CLI would not find it: given in ENGRAM_ADMIN_TOKEN, or a file elsewhere", () => {
    expect(cliSettings({ ...defaults, adminFromEnv: true })).toEqual(['ENGRAM_TOKEN="$ENGRAM_ADMIN_TOKEN"'])
    expect(cliSettings({ ...defaults, tokenFile: "/var/lib/engram/admin-token" })).toEqual(['ENGRAM_TOKEN="$(cat /var/lib/engram/admin-token)"'])
  })
})
