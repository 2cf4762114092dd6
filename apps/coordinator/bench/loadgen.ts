/**
 * The load generator: a process of its own (so its work is not the coordinator's), keep-alive
 * HTTP, a fixed number of requests in flight, a warm-up, then a fixed measured duration.
 * Every request creates a session (`POST /v1/sessions`); with several URLs (replicas) the
 * requests go round-robin. It prints one JSON line: creates/s, p50, p99, failures.
 *
 *   node --import tsx loadgen.ts '{"urls":["http://127.0.0.1:7070"],"token":"…","inFlight":64,
 *     "warmupMs":2000,"durationMs":5000,"prefix":"a"}'
 */
import http from "node:http"

interface Options {
  readonly urls: readonly string[]
  readonly token: string
  readonly inFlight: number
  readonly warmupMs: number
  readonly durationMs: number
  /** Session ids are `<prefix>-<n>`: distinct runs on one database never collide. */
  readonly prefix: string
}

const options = JSON.parse(process.argv[2] ?? "{}") as Options
const agent = new http.Agent({ keepAlive: true, maxSockets: options.inFlight })
const targets = options.urls.map((u) => new URL(u))

const post = (target: URL, path: string, body: string): Promise<number> =>
  new Promise((resolve, reject) => {
    const req = http.request(
      {
        agent,
        host: target.hostname,
        port: target.port,
        method: "POST",
        path,
        headers: { authorization: `Bearer ${options.token}`, "content-type": "application/json", "content-length": Buffer.byteLength(body) },
      },
      (res) => {
        res.on("data", () => undefined)
        res.on("end", () => resolve(res.statusCode ?? 0))
        res.on("error", reject)
      },
    )
    req.on("error", reject)
    req.end(body)
  })

const pct = (sorted: readonly number[], p: number): number => sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))] ?? 0

const main = async (): Promise<void> => {
  let n = 0
  let phase: "warmup" | "measure" | "done" = "warmup"
  const latencies: number[] = []
  let measured = 0
  let failures = 0
  let firstFailure = ""
  const started = performance.now()
  let measureStart = started
  const worker = async (): Promise<void> => {
    while (phase !== "done") {
      const i = n++
      const target = targets[i % targets.length] as URL
      const budget = { memMib: 128 * (1 + (i % 8)), vcpus: 1 + (i % 2) }
      const t0 = performance.now()
      let status = 0
      try {
        status = await post(target, "/v1/sessions", JSON.stringify({ id: `${options.prefix}-${i}`, ...budget }))
      } catch (e) {
        if (firstFailure === "") firstFailure = String(e)
      }
      const t1 = performance.now()
      // The rate counts every answer inside the window; latencies those also sent inside it.
      if (phase === "measure") {
        measured++
        if (t0 >= measureStart) latencies.push(t1 - t0)
        if (status !== 201) {
          failures++
          if (firstFailure === "") firstFailure = `HTTP ${status}`
        }
      }
    }
  }
  const workers = Array.from({ length: options.inFlight }, worker)
  await new Promise((r) => setTimeout(r, options.warmupMs))
  phase = "measure"
  measureStart = performance.now()
  await new Promise((r) => setTimeout(r, options.durationMs))
  const measureEnd = performance.now()
  phase = "done"
  await Promise.all(workers)
  agent.destroy()
  latencies.sort((a, b) => a - b)
  const seconds = (measureEnd - measureStart) / 1000
  console.log(
    JSON.stringify({
      creates: measured,
      perSec: measured / seconds,
      p50: pct(latencies, 50),
      p99: pct(latencies, 99),
      failures,
      firstFailure,
      seconds,
    }),
  )
}

await main()
