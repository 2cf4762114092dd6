// @engram/faults: the fault suite's instruments (the recorded history, the checker, real
// coordinator and agent processes, the client load), the OpenAPI-driven fuzzer's arbitraries and
// the strict-input fuzzers' (cursors, host reports).
export * as Checker from "./Checker.js"
export * as History from "./History.js"
export * as OpenApiArbitraries from "./OpenApiArbitraries.js"
export * as JumpClock from "./JumpClock.js"
export * as Load from "./Load.js"
export * as Observe from "./Observe.js"
export * as PgServer from "./PgServer.js"
export * as Processes from "./Processes.js"
export * as InputArbitraries from "./InputArbitraries.js"
