/**
 * The running coordinator's settings: the validated configuration and what the store is,
 * which decides whether a long-poll must also re-read the store (other replicas may write it).
 */
import { Context } from "effect"
import type { CoordinatorConfig } from "./Config.js"

/** Which backend holds the state. */
export type Backend = "postgres" | "pglite" | "custom"

export interface SettingsShape {
  readonly config: CoordinatorConfig
  readonly backend: Backend
  /** True when other processes may change the store (PostgreSQL): waiters re-read it every `storePollMs`. */
  readonly sharedStore: boolean
}

/** The settings service. */
export class Settings extends Context.Service<Settings, SettingsShape>()("@engram/coordinator/Settings") {}
