/**
 * Several policies on one workload, each run in its own worker thread (`--threads`): the runs
 * share nothing, so a 2-core machine compares two policies in the time of one. Every run is
 * `Simulation.run` itself, so the figures equal a run in the main thread (a test pins it).
 */
import { availableParallelism } from "node:os"
import { Worker } from "node:worker_threads"
import type { ParkPolicy } from "@engram/core"
import * as Simulation from "./Simulation.js"
import type { FleetConfig, Result } from "./Simulation.js"
import type { Workload } from "./Workload.js"

/** What a worker is asked to run. */
export interface Job {
  readonly workload: Workload
  readonly policy: ParkPolicy.Name
  readonly fleet: FleetConfig
}

/** What a worker answers. */
export type Message = { readonly _tag: "progress"; readonly done: number } | { readonly _tag: "result"; readonly result: Result }

/** Threads by default: one per policy, at most one per core. */
export const defaultThreads = (policies: number): number => Math.max(1, Math.min(policies, availableParallelism()))

// The worker module beside this one: `.ts` when run from source (tsx passes its loader on to
// workers through execArgv), `.js` when built.
const workerUrl = (): URL => new URL(import.meta.url.endsWith(".ts") ? "./SimWorker.ts" : "./SimWorker.js", import.meta.url)

const inWorker = (job: Job, onProgress: (done: number) => void): Promise<Result> =>
  new Promise((resolve, reject) => {
    const worker = new Worker(workerUrl(), { workerData: job })
    worker.on("message", (m: Message) => {
      if (m._tag === "progress") onProgress(m.done)
      else {
        resolve(m.result)
        void worker.terminate()
      }
    })
    worker.on("error", reject)
    worker.on("exit", (code) => {
      if (code !== 0) reject(new Error(`simulation worker for ${job.policy} exited with code ${code}`))
    })
  })

/**
 * Runs every policy on the workload, `threads` at a time (1: in this thread, one after the
 * other), and answers the results in the order of `policies`.
 */
export const runPolicies = async (
  workload: Workload,
  policies: readonly ParkPolicy.Name[],
  fleet: FleetConfig,
  threads: number,
  onProgress: (policy: ParkPolicy.Name, done: number) => void = () => undefined,
): Promise<Result[]> => {
  if (threads <= 1 || policies.length <= 1) {
    return policies.map((policy) => Simulation.run(workload, { policy, fleet, onProgress: (d) => onProgress(policy, d) }))
  }
  const results: Result[] = new Array(policies.length)
  let next = 0
  const lane = async (): Promise<void> => {
    for (let k = next++; k < policies.length; k = next++) {
      const policy = policies[k] as ParkPolicy.Name
      results[k] = await inWorker({ workload, policy, fleet }, (d) => onProgress(policy, d))
    }
  }
  await Promise.all(Array.from({ length: Math.min(threads, policies.length) }, lane))
  return results
}
