/**
 * What the fleet bench's scripts share (`main.ts`, `freeze.ts`): the load generator's process
 * (`driver.ts`, driven by JSON lines on stdin), a process's CPU seconds, bounded parallelism.
 */
import { spawn } from "node:child_process"
import { readFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { createInterface } from "node:readline"
import { fileURLToPath } from "node:url"

const here = dirname(fileURLToPath(import.meta.url))

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** CPU seconds (user + system) process `pid` has used. */
export const cpuSecondsOf = (pid: number | undefined): number => {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.split(" ") ?? []
  return (Number(stat[11]) + Number(stat[12])) / 100
}

/** Runs `task` for 0..n-1 with `limit` in flight. */
export const inParallel = async (n: number, limit: number, task: (i: number) => Promise<void>): Promise<void> => {
  let next = 0
  await Promise.all(
    Array.from({ length: Math.min(limit, n) }, async () => {
      while (next < n) await task(next++)
    }),
  )
}

export interface Driver {
  readonly send: <A>(command: Record<string, unknown>) => Promise<A>
  /** The load generator's CPU seconds so far (user + system): whether it, not the coordinator, was the bottleneck. */
  readonly cpuSeconds: () => number
  readonly stop: () => Promise<void>
}

export const startDriver = (): Driver => {
  const child = spawn(process.execPath, ["--import", "tsx", join(here, "driver.ts")], { stdio: ["pipe", "pipe", "inherit"] })
  const waiting = new Map<number, (value: unknown) => void>()
  let next = 0
  void (async () => {
    for await (const line of createInterface({ input: child.stdout })) {
      const { id, value } = JSON.parse(line) as { id: number; value: unknown }
      waiting.get(id)?.(value)
      waiting.delete(id)
    }
  })()
  return {
    cpuSeconds: () => cpuSecondsOf(child.pid),
    send: <A>(command: Record<string, unknown>) =>
      new Promise<A>((resolve) => {
        const id = next++
        waiting.set(id, resolve as (value: unknown) => void)
        child.stdin.write(`${JSON.stringify({ ...command, id })}\n`)
      }),
    stop: async () => {
      if (child.exitCode !== null) return
      const exited = new Promise((r) => child.once("exit", r))
      child.stdin.write(`${JSON.stringify({ cmd: "stop", id: -1 })}\n`)
      await Promise.race([exited, sleep(5000)])
      if (child.exitCode === null) child.kill("SIGKILL")
    },
  }
}
