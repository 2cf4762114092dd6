/** Moves: list them, read one, and the source agent's rounds, commit and abort (SPEC §5). */
import { HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
import { BodyErrors, StandardErrors } from "./Errors.js"
import { doc } from "./internal/doc.js"
import { Abort, Commit, MovesQuery, PathId, ResendMark, Resolve, Round } from "./Payloads.js"
import { Move, MovesPage } from "./Records.js"
import { BearerAuth, StrictInput } from "./Security.js"

const source = " The admin, or the token of the move's source host."

/** `/v1/moves…`. */
export class MovesApi extends HttpApiGroup.make("moves")
  .add(
    HttpApiEndpoint.get("list", "/v1/moves", { query: MovesQuery, success: MovesPage, error: StandardErrors }).annotateMerge(
      doc(
        "List moves",
        "A page of moves, oldest first, filtered by `hostId` (the source or the target) and `state` (`pending`, `committed`, `aborted`): `{items, nextCursor}`; `?limit=&cursor=` as every list. Admin, or a host's token with its own `hostId`.",
      ),
    ),
    HttpApiEndpoint.get("get", "/v1/moves/:id", { params: PathId, success: Move, error: StandardErrors }).annotateMerge(
      doc("Read a move", "The move with its rounds, and its phases and `guard` (committed: the commit allowance its guard used, `prior` or `learned` from how many commits, its estimate, and how far each was off) or its reason and estimate (aborted), and `resendOwed`: true while its source holds the guest's only whole copy, paused, and owes the target the stream (`POST /v1/moves/{id}/resend`; absent from an older coordinator: read it as false), and `committedBy`: who committed it, `source` (its commit with its phases), `target` (the target host's resolve: it runs the guest) or `operator` (the admin's resolve); null while not committed, or committed before the field (absent from an older coordinator: read it as null). The admin, or the token of its source or target host."),
    ),
    HttpApiEndpoint.post("round", "/v1/moves/:id/rounds", { params: PathId, payload: Round, success: Move, error: BodyErrors }).annotateMerge(
      doc(
        "Record a pre-copy round",
        `A round's wire bytes, apparent size, send and capture times (finite, at most 2^53 - 1). \`kind: "intent"\` (all figures 0) is the source's intent, recorded while the guest still runs: the next round is the final one, and the target may run the guest once its stream is complete. From the intent (or, from a source that records none, the final round) no timeout aborts the move; a repeated intent changes nothing; rounds after the final one are refused (409). The final round's figures are recorded once the guest runs on the target, before the commit. Optional \`seq\`: the round's position, the count of records the move held before it (the intent included), an integer >= 0 (400 naming \`seq\` otherwise): the round is recorded only at the move's next position; a repeat of a recorded position with the same figures changes nothing (200: a retry of a round whose answer was lost), with other figures, or a position past the next one (a gap), it is a 409 naming the rule. Without \`seq\` the round is appended (an older source).${source}`,
      ),
    ),
    HttpApiEndpoint.post("commit", "/v1/moves/:id/commit", { params: PathId, payload: Commit, success: Move, error: BodyErrors }).annotateMerge(
      doc(
        "Commit a move",
        `The target runs the guest: \`{downtimeMs, captureMs, sendMs, commitMs}\`, each > 0 (400 naming a phase that is not) and capture + send + commit at most \`downtimeMs\`; optional \`guard\`: \`{allowanceMs, allowanceSource, allowanceSamples, estimateMs}\`, what the source's downtime guard decided on, kept on the move with its errors (\`estimateErrorMs\`, \`allowanceErrorMs\`). The commit phase joins the host pair's recent commits, from which the allowance of its next moves is learned (SPEC §13). The move's final round must be recorded first (409 otherwise). The session runs on the target; then the queue is drained.${source}`,
      ),
    ),
    HttpApiEndpoint.post("abort", "/v1/moves/:id/abort", { params: PathId, payload: Abort, success: Move, error: BodyErrors }).annotateMerge(
      doc(
        "Abort a move",
        `The guest runs on the source: the target's reservation is dropped. \`estimateMs\` is the downtime estimate a guard refusal was made on (kept as \`abortEstimateMs\`; the mover gets 503 \`ErrMoveDowntime\`). Then the queue is drained.${source}`,
      ),
    ),
    HttpApiEndpoint.post("resolve", "/v1/moves/:id/resolve", { params: PathId, payload: Resolve, success: Move, error: BodyErrors }).annotateMerge(
      doc(
        "Resolve an in-doubt move",
        "Ends a pending move whose final round is recorded (SPEC §13: such a move is never reclaimed; it waits for this or for its source's commit or abort). `{outcome: \"commit\", reason}`: the guest runs on the target, the session goes there (the move keeps no phases: its pause was not measured); 409 on a move with neither its intent nor its final round recorded (not in doubt); and the admin's commit before the final round is a 409 while the move's source is heard (it reported within the stale window: it may still be sending, and the target may hold no complete copy), judged with the commit in one step on a store that can. `{outcome: \"abort\", reason}`: the guest runs on the source, the target's reservation is dropped and its agent destroys its copy. The admin (an operator's explicit word), or the token of the move's target host for `commit` (its agent reports that it runs the guest). Then the queue is drained.",
      ),
    ),
    HttpApiEndpoint.post("resend", "/v1/moves/:id/resend", { params: PathId, payload: ResendMark, success: Move, error: BodyErrors }).annotateMerge(
      doc(
        "Mark a resend owed",
        `\`{owed: true}\`: the move's source holds the guest's only whole copy, paused, and owes its target the stream (the move was committed without the source's phases, by an operator while the source was not heard, and the source's final send then failed, or the target refused its commit saying its stream never completed). Only then, when the target's reservations are reclaimed (the target silent past the stale window) while the source is heard and has room, does the session go back to the source, whose agent resumes its copy; a move committed without phases but not marked (the target's own resolution: it ran the guest) leaves the session \`lost\`. 409 on a move that is not committed, or committed with phases. \`{owed: false}\`: the debt is settled (the target runs the guest, or the session went elsewhere or ended); always accepted. A repeat changes nothing. Answers the move with the mark as kept (\`resendOwed\`), as every read of the move shows it. A coordinator whose store keeps no mark (its backend has no \`markResendOwed\`) answers 400 naming \`owed\`, nothing kept.${source} The token of the move's target host may clear the mark (\`{owed: false}\`; its \`{owed: true}\` is refused 403): its agent clears it before it resumes a stream sent again, so that its death after that leaves the session lost, never sent back to the source's older copy. The way back holds while the mark is set: the source's agent sets it again after every answer of the target that it runs nothing of the move (its stream never completed, or a "not yet" saying it resumed nothing), since the target may have cleared it first. Every clear counts (the move's \`resendClears\`); a tell naming \`seenClears\` (the count its source read before it) below the move's count is stale (the target cleared the mark since, before it resumed: a tell that reached the coordinator late) and changes nothing: answered 200 with the move as it is (\`resendOwed\` false). Without \`seenClears\` (an older source's agent) the mark is set as before the count. A \`seenClears\` that is not an integer >= 0 is a 400 naming it.`,
      ),
    ),
  )
  .middleware(StrictInput)
  .middleware(BearerAuth) {}
