/**
 * @engram/cli: the `engram` command line (`Cli.command`, `Cli.run`) and its pure parts: figures
 * for a person (`Format`), where the coordinator and its token are (`Target`), and why a
 * session waits (`Why`).
 */
export * as Cli from "./Cli.js"
export * as Format from "./Format.js"
export * as Target from "./Target.js"
export * as Why from "./Why.js"
