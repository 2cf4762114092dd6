/** A worker thread's entry: one `Simulation.run` of the job it was given (see Parallel.ts). */
import { parentPort, workerData } from "node:worker_threads"
import type { Job, Message } from "./Parallel.js"
import * as Simulation from "./Simulation.js"

const job = workerData as Job
const post = (m: Message): void => parentPort?.postMessage(m)
let last = -1
const result = Simulation.run(job.workload, {
  policy: job.policy,
  fleet: job.fleet,
  onProgress: (done) => {
    // Percent steps are enough for a progress bar.
    const pct = Math.floor(done * 100)
    if (pct !== last) {
      last = pct
      post({ _tag: "progress", done })
    }
  },
})
post({ _tag: "result", result })
