/**
 * Answers from peers read with a bound in bytes. A peer's answer is read before its proof (that
 * it holds the peer secret) is checked, and a peer URL may come from the coordinator, which a
 * stolen host token can make report any address: read whole, an address that streams gigabytes
 * would be buffered in the agent's memory. So a read stops past its bound: the body is cancelled
 * (its connection closed) and the rest never read; a length declared over the bound is refused
 * before a byte is read. The bounds are generous over what a real answer holds
 * (`peerAnswerMaxBytes`, `ImageFetch.listingMaxBytes`).
 */
import { Effect, Stream } from "effect"

/**
 * The bound of a move's answer from its target (`PeerLink`): a prepare's is the runtime's endpoint
 * and a 64-character proof, a commit's a figure, a refusal's a message: a few hundred bytes. The
 * same as the peer server's own request bound (`PeerServer.peerMaxBodyBytes`).
 */
export const peerAnswerMaxBytes = 64 * 1024

/** Whether a `content-length` declares more than `maxBytes` (a missing or unreadable one does not). */
const declaresOver = (contentLength: string | null | undefined, maxBytes: number): boolean => {
  const declared = contentLength == null ? NaN : Number(contentLength)
  return Number.isFinite(declared) && declared > maxBytes
}

/** Chunks as one buffer. */
const joined = (chunks: readonly Uint8Array[], bytes: number): Uint8Array => {
  const out = new Uint8Array(bytes)
  let at = 0
  for (const c of chunks) {
    out.set(c, at)
    at += c.length
  }
  return out
}

/**
 * A web body's bytes when it holds at most `maxBytes`; undefined past them, the body cancelled
 * there (nothing more is read). Fails as the read does (an abort, a reset).
 */
export const webBodyAtMost = async (body: ReadableStream<Uint8Array> | null, maxBytes: number, contentLength?: string | null): Promise<Uint8Array | undefined> => {
  if (body === null) return new Uint8Array(0)
  if (declaresOver(contentLength, maxBytes)) {
    await body.cancel().catch(() => undefined)
    return undefined
  }
  const reader = body.getReader()
  const chunks: Uint8Array[] = []
  let bytes = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) return joined(chunks, bytes)
    bytes += value.length
    if (bytes > maxBytes) {
      await reader.cancel().catch(() => undefined)
      return undefined
    }
    chunks.push(value)
  }
}

/** Past the bound: stops the stream (its scope cancels the body). */
class Over {
  readonly _tag = "Over"
}

/**
 * A stream's bytes (an Effect HTTP client's answer body) when it holds at most `maxBytes`;
 * undefined past them, the stream stopped there (its body cancelled, nothing more read).
 */
export const streamAtMost = <E>(stream: Stream.Stream<Uint8Array, E>, maxBytes: number, contentLength?: string | undefined): Effect.Effect<Uint8Array | undefined, E> => {
  // A declared length over the bound: refused at the first chunk (the stream is opened, so its close cancels the body).
  const bound = declaresOver(contentLength, maxBytes) ? -1 : maxBytes
  return Stream.runFoldEffect(
    stream,
    () => ({ chunks: [] as Uint8Array[], bytes: 0 }),
    (acc, chunk): Effect.Effect<{ chunks: Uint8Array[]; bytes: number }, Over> => {
      const bytes = acc.bytes + chunk.length
      if (bytes > bound) return Effect.fail(new Over())
      acc.chunks.push(chunk)
      return Effect.succeed({ chunks: acc.chunks, bytes })
    },
  ).pipe(
    Effect.map((acc): Uint8Array | undefined => joined(acc.chunks, acc.bytes)),
    Effect.catch((e) => (e instanceof Over ? Effect.succeed(undefined) : Effect.fail(e))),
  )
}
