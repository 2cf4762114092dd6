/** The running coordinator's settings: the validated configuration and what the store is. */
import { Context } from "effect"
import type { CoordinatorConfig } from "./Config.js"

/** Which backend holds the state. */
export type Backend = "postgres" | "pglite" | "custom"

export interface SettingsShape {
  readonly config: CoordinatorConfig
  readonly backend: Backend
}

/** The settings service. */
export class Settings extends Context.Service<Settings, SettingsShape>()("@engram/coordinator/Settings") {}
