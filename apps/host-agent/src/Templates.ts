/**
 * The templates of one host (a booted, paused guest kept by the runtime under a name, from
 * which a session starts instead of booting): which the runtime holds, and building one when
 * asked (configured at start, or a session that names one this host does not hold). Builds run
 * one at a time (each boots a guest); a second ask for the same template waits for the first.
 */
import { nowMs, type RuntimeError, type TemplateInfo, type TemplateSpec, type VmRuntimeShape } from "@engram/runtime"
import { Names } from "@engram/core"
import { Effect, Semaphore } from "effect"

export interface Templates {
  /** The templates the runtime holds. */
  readonly held: Effect.Effect<readonly TemplateInfo[]>
  /** The template `t.name`: held, or built now. A held one of another size is answered as it is (the caller decides). */
  readonly ensure: (t: TemplateSpec) => Effect.Effect<TemplateInfo, RuntimeError>
}

/** Parses `ENGRAM_AGENT_TEMPLATES`: `name=memMib:vcpus` separated by commas; the problem in words, or the specs. */
export const parse = (text: string): { readonly specs: readonly TemplateSpec[] } | { readonly problem: string } => {
  const specs: TemplateSpec[] = []
  for (const part of text.split(",").map((p) => p.trim()).filter((p) => p !== "")) {
    const m = /^([^=]*)=(\d+):(\d+)$/.exec(part)
    if (m === null) return { problem: `must be name=memMib:vcpus, separated by commas (e.g. small=256:1): ${JSON.stringify(part)}` }
    const [, name = "", mem, vcpus] = m
    // The one template name rule, as the API and the runtimes judge it.
    if (!Names.isTemplateName(name)) return { problem: `a template name ${Names.templateNameRule}: ${JSON.stringify(name)}` }
    if (specs.some((s) => s.name === name)) return { problem: `names the template ${name} twice` }
    if (Number(mem) <= 0 || Number(vcpus) <= 0) return { problem: `needs a memMib and vcpus > 0: ${JSON.stringify(part)}` }
    specs.push({ name, memMib: Number(mem), vcpus: Number(vcpus) })
  }
  return { specs }
}

/**
 * `onBuilt` runs after each build (the agent reports its host at once, so the coordinator's
 * placement prefers this host for the new template without waiting for the next periodic report).
 */
export const make = (hostId: string, runtime: VmRuntimeShape, onBuilt: (t: TemplateInfo) => Effect.Effect<void> = () => Effect.void): Effect.Effect<Templates> =>
  Effect.gen(function* () {
    const builds = yield* Semaphore.make(1)
    const ensure = (t: TemplateSpec) =>
      Effect.gen(function* () {
        const held = (yield* runtime.templates).find((h) => h.name === t.name)
        if (held !== undefined) return held
        const t0 = yield* nowMs
        yield* Effect.logInfo("template: building", { hostId, template: t.name, memMib: t.memMib, vcpus: t.vcpus })
        const built = yield* runtime.buildTemplate(t)
        yield* Effect.logInfo("template: built", { hostId, template: t.name, method: built.method, bytes: built.bytes, ms: Math.round((yield* nowMs) - t0) })
        yield* onBuilt(built)
        return built
      }).pipe(builds.withPermits(1))
    return { held: runtime.templates, ensure }
  })
