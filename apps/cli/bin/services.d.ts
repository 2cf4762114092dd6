/** A service `engram` runs: its package, its source in a checkout, what `--help` says. */
export interface Service {
  readonly name: string
  readonly source: string
  readonly help: readonly string[]
}
/** The services, by command. */
export declare const services: { readonly coordinator: Service; readonly agent: Service }
/** What a command line (without node and the script) asks of the services; null when it names none. */
export declare const serviceCommand: (args: readonly string[]) =>
  | null
  | { readonly _tag: "Help"; readonly text: string }
  | { readonly _tag: "Usage"; readonly text: string }
  | { readonly _tag: "Run"; readonly command: "coordinator" | "agent"; readonly service: Service }
