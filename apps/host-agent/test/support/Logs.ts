// What the agent logs, captured for a test to read: each line's text and fields, as the agent's
// `Effect.log*` calls give them (`message, {fields}`).
import { Logger } from "effect"
import type { Layer, LogLevel } from "effect"

/** A line logged: its text and its fields. */
export interface Said {
  readonly message: string
  readonly fields: Record<string, unknown>
}

/** A logger (`layer`) keeping the lines of `level` in `lines`, in the order logged. */
export const capture = (level: LogLevel.LogLevel): { readonly layer: Layer.Layer<never>; readonly lines: Said[] } => {
  const lines: Said[] = []
  const layer = Logger.layer([
    Logger.make(({ logLevel, message }) => {
      if (logLevel !== level) return
      const [text, fields] = Array.isArray(message) ? message : [message]
      lines.push({ message: String(text), fields: (fields ?? {}) as Record<string, unknown> })
    }),
  ])
  return { layer, lines }
}
