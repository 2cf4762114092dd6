/**
 * OpenTelemetry traces, over OTLP/HTTP (JSON) to a collector (`ENGRAM_OTLP_URL`; Jaeger,
 * Tempo, the OpenTelemetry Collector, Honeycomb… all take it), from `effect/observability`.
 * What a trace shows: every request as a server span named for its route (`POST /v1/sessions`);
 * a placement as `engram.session.create` with its store call (`engram.store.createSession`) and
 * the queue drains that place waiting sessions (`engram.queue.drain`); a move as
 * `engram.session.move` from its start to its outcome, holding the store's `beginMove`, the
 * wait for the outcome (`engram.move.wait`) and, when the agent's rounds, commit or abort reach
 * this replica, one span each (`engram.move.round`, `engram.move.commit`, `engram.move.abort`),
 * linked to the request that carried it.
 *
 * Liveness, readiness, metrics scrapes and the dashboard's own files make no spans, nor do the
 * reaper loop and the dashboard's fleet samples (one every few seconds: noise, not traces).
 *
 * Without `ENGRAM_OTLP_URL` the coordinator makes none of these spans (`TracingEnabled` is false
 * and `span` returns the effect as it is), so the request path pays for nothing it does not send.
 */
import { Env } from "@engram/process"
import { Context, Effect, Layer, Option, Redacted } from "effect"
import type { Tracer } from "effect"
import { FetchHttpClient, HttpMiddleware } from "effect/http"
import { OtlpExporter, OtlpSerialization, OtlpTracer } from "effect/observability"

/** Whether this coordinator exports spans. Read once where spans are made. */
export const TracingEnabled = Context.Reference<boolean>("@engram/coordinator/TracingEnabled", { defaultValue: () => false })

/** The service's name in every span's resource. */
export const serviceName = "engram-coordinator"

/** Where spans go: the collector's OTLP/HTTP base URL, and the headers it needs (an API key). */
export interface Exporting {
  readonly url: string
  readonly headers: Redacted.Redacted<string> | null
  /** How often spans are sent (default 1 s); they are also sent when the coordinator stops. */
  readonly exportIntervalMs?: number | undefined
}

/** The traces endpoint of a collector's base URL (`…/v1/traces`, unless the URL already names it). */
export const tracesUrl = (base: string): string => (/\/v1\/traces\/?$/.test(base) ? base : `${base.replace(/\/+$/, "")}/v1/traces`)

/** `key=value,key2=value2` (the OpenTelemetry headers format), values URL-decoded. */
export const parseHeaders = (text: string): Record<string, string> => Object.fromEntries(Env.keyValues(text).map((e) => [e.key, decodeURIComponent(e.value)] as const))

/**
 * The tracer: the OTLP exporter when `exporting` names a collector, with server spans named for
 * their route (`routeOf`); nothing at all otherwise.
 */
export const layer = (
  exporting: Exporting | null,
  routeOf: (method: string, url: string) => string,
  serviceVersion: string,
): Layer.Layer<OtlpExporter.Flusher> => {
  if (exporting === null) return OtlpExporter.layerFlusher
  return Layer.mergeAll(
    OtlpTracer.layer({
      url: tracesUrl(exporting.url),
      resource: { serviceName, serviceVersion },
      headers: exporting.headers === null ? {} : parseHeaders(Redacted.value(exporting.headers)),
      exportInterval: exporting.exportIntervalMs ?? 1000,
    }).pipe(Layer.provide([OtlpSerialization.layerJson, FetchHttpClient.layer])),
    Layer.succeed(TracingEnabled, true),
    Layer.succeed(HttpMiddleware.SpanNameGenerator, (request) => `${request.method} ${routeOf(request.method, request.url)}`),
    // Probes, scrapes and the page's files are no trace worth sending.
    Layer.succeed(HttpMiddleware.TracerDisabledWhen, (request) => untracedPaths.test(request.url)),
  )
}

/** Requests that make no spans: liveness, readiness, metrics, the API description and reference, the dashboard's files and long-poll. */
const untracedPaths = /^\/(livez|healthz|readyz|metrics|openapi\.json|docs|ui)(\/|\?|$)|^\/(\?|$)/

/** Wraps an effect in a span named `name` when tracing is on; the effect as it is otherwise. */
export type Span = <A, E, R>(name: string, options?: Tracer.SpanOptionsNoTrace) => (self: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>

const untraced: Span = () => (self) => self

/** The span maker that makes none. */
export const none: Span = untraced

const traced: Span = (name, options) => (self) => Effect.withSpan(self, name, options ?? {})

/** The span maker of this coordinator (read once, where handlers are built). */
export const spans: Effect.Effect<Span> = Effect.gen(function* () {
  return (yield* TracingEnabled) ? traced : untraced
})

/**
 * A span maker for work that matters only within something traced (a store call): a child
 * span under the current one, and none where nothing is traced (a probe, a background loop).
 */
export const childSpans = (span: Span): Span =>
  !isTracing(span)
    ? untraced
    : <A, E, R>(name: string, options?: Tracer.SpanOptionsNoTrace) =>
        (self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
          Effect.flatMap(Effect.option(Effect.currentParentSpan), (parent) => (Option.isSome(parent) ? span<A, E, R>(name, options)(self) : self))

/** Whether a span maker makes spans. */
export const isTracing = (span: Span): boolean => span !== untraced

/** Adds attributes to the current span where `span` makes spans (nothing happens otherwise). */
export const annotate = (span: Span, attributes: Record<string, unknown>): Effect.Effect<void> =>
  isTracing(span) ? Effect.annotateCurrentSpan(attributes) : Effect.void

/**
 * The open moves' spans, by move id: the agent's rounds, commit and abort reach this replica in
 * requests of their own, and their spans join the move's trace as children of its span.
 */
export interface MoveSpansShape {
  readonly open: (moveId: string, span: Tracer.AnySpan) => Effect.Effect<void>
  readonly close: (moveId: string) => Effect.Effect<void>
  readonly of: (moveId: string) => Option.Option<Tracer.AnySpan>
}

export class MoveSpans extends Context.Service<MoveSpans, MoveSpansShape>()("@engram/coordinator/MoveSpans") {
  static readonly layer: Layer.Layer<MoveSpans> = Layer.sync(MoveSpans, () => {
    const byMove = new Map<string, Tracer.AnySpan>()
    return MoveSpans.of({
      open: (moveId, span) => Effect.sync(() => void byMove.set(moveId, span)),
      close: (moveId) => Effect.sync(() => void byMove.delete(moveId)),
      of: (moveId) => Option.fromNullishOr(byMove.get(moveId)),
    })
  })
}

/**
 * The span of one of a move's steps reported by its agent (`engram.move.round`, …): a child of
 * the move's span where this replica holds it, linked to the request that carried the step.
 */
export const moveStep =
  (span: Span, moveSpans: MoveSpansShape, name: string, moveId: string, attributes: Record<string, unknown>) =>
  <A, E, R>(self: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
    !isTracing(span)
      ? self
      : Effect.flatMap(Effect.option(Effect.currentParentSpan), (request) => {
      const parent = moveSpans.of(moveId)
      const links = Option.isSome(request) && Option.isSome(parent) ? [{ span: request.value, attributes: { "engram.link": "request" } }] : []
      return self.pipe(span(name, { attributes: { "engram.move.id": moveId, ...attributes }, links, ...(Option.isSome(parent) ? { parent: parent.value } : {}) }))
    })
