/**
 * The templates of one host (a booted, paused guest kept by the runtime under a name, from
 * which a session starts instead of booting): which the runtime holds, and building one when
 * asked (configured at start, or a session that names one this host does not hold). Builds run
 * one at a time (each boots a guest); an ask for a template being built shares that build, and a
 * template whose build failed is not built again before its retry time (`make`).
 */
import { nowMs, RuntimeError, type TemplateInfo, type TemplateSpec, type VmRuntimeShape } from "@engram/runtime"
import { Names } from "@engram/core"
import { Cause, Deferred, Effect, Exit, Semaphore } from "effect"

export interface Templates {
  /** The templates the runtime holds. */
  readonly held: Effect.Effect<readonly TemplateInfo[]>
  /** The template `t.name`: held, or built now. A held one of another size is answered as it is (the caller decides). */
  readonly ensure: (t: TemplateSpec) => Effect.Effect<TemplateInfo, RuntimeError>
}

/**
 * Why `spec` is refused beside the specs `before` it (the environment's and a program's one
 * rule): a name by the API's rule, each once, memMib and vcpus integers > 0. Undefined when it holds.
 */
export const specProblem = (spec: TemplateSpec, before: readonly TemplateSpec[]): string | undefined => {
  // The one template name rule, as the API and the runtimes judge it.
  if (typeof spec.name !== "string" || !Names.isTemplateName(spec.name)) return `a template name ${Names.templateNameRule}: ${JSON.stringify(spec.name)}`
  if (before.some((s) => s.name === spec.name)) return `names the template ${spec.name} twice`
  const positive = (n: unknown) => typeof n === "number" && Number.isInteger(n) && n > 0
  if (!positive(spec.memMib) || !positive(spec.vcpus)) return `needs a memMib and vcpus that are integers > 0: ${JSON.stringify(`${spec.name}=${spec.memMib}:${spec.vcpus}`)}`
  return undefined
}

/** Why a program's `specs` are refused (`specProblem` of each); undefined when they hold. */
export const specsProblem = (specs: unknown): string | undefined => {
  if (!Array.isArray(specs)) return "must be a list of templates ({ name, memMib, vcpus })"
  const before: TemplateSpec[] = []
  for (const spec of specs as unknown[]) {
    if (typeof spec !== "object" || spec === null) return `must be a list of templates ({ name, memMib, vcpus }): ${JSON.stringify(spec)}`
    const problem = specProblem(spec as TemplateSpec, before)
    if (problem !== undefined) return problem
    before.push(spec as TemplateSpec)
  }
  return undefined
}

/** Parses `ENGRAM_AGENT_TEMPLATES`: `name=memMib:vcpus` separated by commas; the problem in words, or the specs. */
export const parse = (text: string): { readonly specs: readonly TemplateSpec[] } | { readonly problem: string } => {
  const specs: TemplateSpec[] = []
  for (const part of text.split(",").map((p) => p.trim()).filter((p) => p !== "")) {
    const m = /^([^=]*)=(\d+):(\d+)$/.exec(part)
    if (m === null) return { problem: `must be name=memMib:vcpus, separated by commas (e.g. small=256:1): ${JSON.stringify(part)}` }
    const [, name = "", mem, vcpus] = m
    const spec = { name, memMib: Number(mem), vcpus: Number(vcpus) }
    const problem = specProblem(spec, specs)
    if (problem !== undefined) return { problem }
    specs.push(spec)
  }
  return { specs }
}

/** How long a failed build of a template is remembered before one is tried again: doubling from this. */
export const failedBuildRetryMs = 60_000
/** The longest wait before a failed template is built again. */
export const failedBuildRetryMaxMs = 30 * 60_000

/**
 * `onBuilt` runs after each build (the agent reports its host at once, so the coordinator's
 * placement prefers this host for the new template without waiting for the next periodic report).
 *
 * Every caller asking for a template being built shares that one build (and its outcome). A
 * build that failed is remembered: until its retry time (1 min, doubling to 30 min on each
 * further failure, forgotten on a success) an ask fails at once with that failure, so a template
 * whose guest never gets ready (each try waits the runtime's whole ready timeout) costs one build
 * per retry time, not one per session that names it, each behind the last.
 */
export const make = (hostId: string, runtime: VmRuntimeShape, onBuilt: (t: TemplateInfo) => Effect.Effect<void> = () => Effect.void): Effect.Effect<Templates> =>
  Effect.gen(function* () {
    const builds = yield* Semaphore.make(1)
    const building = new Map<string, Deferred.Deferred<TemplateInfo, RuntimeError>>()
    const failed = new Map<string, { readonly until: number; readonly retryMs: number; readonly error: RuntimeError }>()
    const build = (t: TemplateSpec) =>
      Effect.gen(function* () {
        const held = (yield* runtime.templates).find((h) => h.name === t.name)
        if (held !== undefined) return held
        const t0 = yield* nowMs
        yield* Effect.logInfo("template: building", { hostId, template: t.name, memMib: t.memMib, vcpus: t.vcpus })
        const built = yield* runtime.buildTemplate(t).pipe(
          Effect.tapError((error) =>
            Effect.gen(function* () {
              const retryMs = Math.min(failedBuildRetryMaxMs, (failed.get(t.name)?.retryMs ?? failedBuildRetryMs / 2) * 2)
              failed.set(t.name, { until: (yield* nowMs) + retryMs, retryMs, error })
              yield* Effect.logWarning("template: build failed", { hostId, template: t.name, error: error.message, retryInMs: retryMs })
            }),
          ),
        )
        failed.delete(t.name)
        yield* Effect.logInfo("template: built", { hostId, template: t.name, method: built.method, bytes: built.bytes, ms: Math.round((yield* nowMs) - t0) })
        yield* onBuilt(built)
        return built
      }).pipe(builds.withPermits(1))
    const ensure = (t: TemplateSpec): Effect.Effect<TemplateInfo, RuntimeError> =>
      Effect.gen(function* () {
        const held = (yield* runtime.templates).find((h) => h.name === t.name)
        if (held !== undefined) return held
        const now = yield* nowMs
        // One step, with no yield between the look and the set: two asks never both lead a build.
        const turn = yield* Effect.sync(() => {
          const shared = building.get(t.name)
          if (shared !== undefined) return { _tag: "Share", shared } as const
          const before = failed.get(t.name)
          if (before !== undefined && now < before.until) return { _tag: "Failed", before } as const
          const outcome = Deferred.makeUnsafe<TemplateInfo, RuntimeError>()
          building.set(t.name, outcome)
          return { _tag: "Lead", outcome } as const
        })
        if (turn._tag === "Share") return yield* Deferred.await(turn.shared)
        if (turn._tag === "Failed")
          return yield* new RuntimeError({
            op: "buildTemplate",
            vmId: `@template-${t.name}`,
            message: `its last build failed (${turn.before.error.message}); tried again in ${Math.ceil((turn.before.until - now) / 1000)} s`,
          })
        const outcome = turn.outcome
        // The build's outcome is every sharer's; one cut short (the agent stopping) fails them too.
        return yield* build(t).pipe(
          Effect.onExit((exit) =>
            Effect.suspend(() => {
              building.delete(t.name)
              return Exit.isSuccess(exit) || Cause.hasFails(exit.cause)
                ? Deferred.done(outcome, exit)
                : Deferred.fail(outcome, new RuntimeError({ op: "buildTemplate", vmId: `@template-${t.name}`, message: "the build was stopped" }))
            }),
          ),
        )
      })
    return { held: runtime.templates, ensure }
  })
