/**
 * Sessions: create (placed, queued, or refused for lack of room), read (with where a queued one
 * stands), list a page at a time, wait for a state, the history, the agent's acknowledgements
 * (`started`, `descended`), idle (the park gate decides), resume (warm or cold), end, and a
 * live move that waits for its outcome.
 */
import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema } from "effect/http-api"
import { BodyErrors, LongPollErrors, StandardErrors, WaitTimeout } from "./Errors.js"
import { doc } from "./internal/doc.js"
import { CreateSession, DescendedQuery, PageQuery, PathId, SessionsQuery, SetTtl, StartMove, WaitQuery } from "./Payloads.js"
import {
  Idled,
  MoveCommitted,
  Placed,
  Queued,
  ResumedPlaced,
  ResumedQueued,
  ResumedWarm,
  Session,
  SessionDetail,
  SessionEventsPage,
  SessionsPage,
} from "./Records.js"
import { AdminOnly, BearerAuth, StrictInput } from "./Security.js"

const admin = " Admin only."
const hostOrAdmin = " The admin, or the token of the session's host."

/** 201 placed or 202 queued. */
const PlaceAnswers = [Placed.pipe(HttpApiSchema.status(201)), Queued.pipe(HttpApiSchema.status(202))] as const

/** 200 resumed warm, 201 placed (cold) or 202 queued (cold). */
const ResumeAnswers = [
  ResumedWarm.pipe(HttpApiSchema.status(200)),
  ResumedPlaced.pipe(HttpApiSchema.status(201)),
  ResumedQueued.pipe(HttpApiSchema.status(202)),
] as const

/** `/v1/sessions…`. */
export class SessionsApi extends HttpApiGroup.make("sessions")
  .add(
    HttpApiEndpoint.post("create", "/v1/sessions", { payload: CreateSession, success: PlaceAnswers, error: BodyErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(
        doc(
          "Create a session",
          `Places a session of \`{memMib, vcpus}\` on the best-fitting ready host that has reported (\`affinity\` hosts first, then hosts holding its \`template\`): 201 \`{id, state, hostId}\`. When nothing fits it is queued: 202 \`{id, state: "queued", position, noFit, tooBig}\` with each host's reason (\`ram_full\`, \`cpu_full\`, \`entries_full\`, \`unmeasured\`, \`silent\` — its agent has not reported for longer than the reservation stale window, so it takes nothing until it reports again —, \`cordoned\`, \`draining\`, \`fits_now\`) and whether the budget is too big for every host even when empty. With \`onNoRoom: "refuse"\` a session that fits nowhere is not stored: 409 \`{error: "NoRoom", noFit, tooBig}\`. Optional lifetimes (ms, integers from 1 to 10 years): \`idleTimeoutMs\` — no reported guest activity for that long makes the running session idle, and the park gate parks or descends it; \`ttlMs\` — the session is ended that long after its create, whatever its state (its history says \`ttl expired\`). An optional \`template\` (a name: 1-100 characters of \`[A-Za-z0-9._-]\`, not starting with \`.\`) starts the session from that template instead of a boot: a host whose agent holds a template of that name and of the session's size ranks first among the hosts that fit; a host without it still takes the session (its agent builds the template, or boots). Without \`id\` a UUID is generated (an id is 1-100 characters of \`[A-Za-z0-9._-]\`, not \`.\` or \`..\`); a repeated \`id\` answers the existing session when it asks for that session: a different budget, \`affinity\`, \`idleTimeoutMs\`, \`ttlMs\` (compared as the deadline it set: the first create's time + \`ttlMs\`) or \`template\` under it is a 409 whose \`message\` names the first that differs, and so is \`onNoRoom: "refuse"\` for a queued session (an option left out of the repeat is not compared); so is a repeat after the session ended, was lost or descended (409 \`{error: "Conflict", entity: "session", id, state}\`, \`state\` and the \`message\` naming the state: a create cannot bring it back, a new session needs a new id; a descended session is restored by \`POST /v1/sessions/{id}/resume\`; once the ended session is pruned, after \`ENGRAM_RETENTION_MS\`, the id is free again).${admin}`,
        ),
      ),
    HttpApiEndpoint.get("list", "/v1/sessions", { query: SessionsQuery, success: SessionsPage, error: StandardErrors }).annotateMerge(
      doc(
        "List sessions",
        "A page of sessions, oldest first, filtered by `state` and `hostId`: `{items, nextCursor}`. Pass `nextCursor` back as `?cursor=` for the next page (null: the last); `?limit=` from 1 to 1000 (default 100). A cursor that is not one of this list's is a 400 naming `cursor`. Admin, or a host's token with its own `hostId`.",
      ),
    ),
    HttpApiEndpoint.get("get", "/v1/sessions/:id", { params: PathId, success: SessionDetail, error: StandardErrors }).annotateMerge(
      doc(
        "Read a session",
        `The session's state, budget, host and reservation; while it is queued, \`queue: {position, noFit, tooBig}\` says where it stands and why no host takes it (null otherwise).${hostOrAdmin} The token of the source or the target host of the session's latest move reads it too, wherever the session is now (a move's source owing its target a resend tells "still placed on the target" from "ended or elsewhere" by it); any other host's: 403.`,
      ),
    ),
    HttpApiEndpoint.get("wait", "/v1/sessions/:id/wait", { params: PathId, query: WaitQuery, success: SessionDetail, error: [...LongPollErrors, WaitTimeout] }).annotateMerge(
      doc(
        "Wait for a session's state",
        `Long-polls until the session is in \`state\` and answers it (200, as \`GET /v1/sessions/{id}\`); 408 \`{error: "WaitTimeout", state}\` when \`timeoutMs\` (default 30000, at most 60000) runs out first (a little early rather than late: by up to a twentieth of it, at most 1 s); 409 \`{error: "Unreachable", from, to}\` as soon as the state can no longer come (the session ended, or was lost). Woken by changes made through any replica. Capped per credential and in total like the assignments long-poll (429 \`TooManyWaits\` with \`Retry-After\` beyond); a host token rotated or removed meanwhile answers 401 at once.${hostOrAdmin}`,
      ),
    ),
    HttpApiEndpoint.get("events", "/v1/sessions/:id/events", { params: PathId, query: PageQuery, success: SessionEventsPage, error: StandardErrors }).annotateMerge(
      doc(
        "A session's history",
        `What happened to the session, oldest first: \`{items: [{seq, at, kind, hostId?, …}], nextCursor}\`. Kinds: \`created\`, \`queued\`, \`placed\` (on \`hostId\`), \`running\`, \`parked\`, \`descending\` (\`cause\` idle or yield, with the gate's \`reason\`), \`descended\`, \`resumed\` (\`warm\` or \`cold\`), \`move_begun\`, \`moved\` (with its \`phases\`), \`move_aborted\` (with the \`estimateMs\` a downtime refusal was made on), \`lost\`, \`ended\`, \`ttl_set\`, \`guest_lost\` (its host's agent lost the guest — \`hostId\`, \`reason\` — and booted a fresh one: its memory state is gone; with \`moveId\` and \`toHostId\` when reported after that move took the session away: the copy lost was the one on \`hostId\`, before the move). Written in the same change as the step it records; paged like every list.${hostOrAdmin}`,
      ),
    ),
    HttpApiEndpoint.post("idle", "/v1/sessions/:id/idle", { params: PathId, success: Idled, error: StandardErrors }).annotateMerge(
      doc(
        "A running session went idle",
        `The park gate decides on one fleet read: it parks (paused in RAM, keeps its reservation) on a measured host while no queued session is without room, else it descends (captured to storage, its room released). Answers \`{id, state}\`.${hostOrAdmin}`,
      ),
    ),
    HttpApiEndpoint.post("resume", "/v1/sessions/:id/resume", { params: PathId, success: ResumeAnswers, error: StandardErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(
        doc(
          "Resume a parked or descended session",
          `Resume is one verb (SPEC §12). A parked session resumes warm: running again on its host at once, no queue, no placement — 200 \`{id, state: "running", hostId, resumed: "warm"}\`. A descended session is restored cold from its descent image: 201 \`{id, state, hostId, resumed: "cold"}\` when placed, 202 \`{id, state: "queued", position, noFit, tooBig, resumed: "cold"}\` when queued. 409 from any other state.${admin}`,
        ),
      ),
    HttpApiEndpoint.post("started", "/v1/sessions/:id/started", { params: PathId, success: Session, error: StandardErrors }).annotateMerge(
      doc("The agent started the session's VM", `\`pending → running\`; a repeat is a 409 (the agent counts it as done).${hostOrAdmin}`),
    ),
    HttpApiEndpoint.post("descended", "/v1/sessions/:id/descended", { params: PathId, query: DescendedQuery, success: Session, error: StandardErrors }).annotateMerge(
      doc(
        "The agent stored the session's capture",
        `\`descending → descended\`: the reservation is released; then the queue is drained. The session's \`imageHostId\` becomes its host (its agent holds the image), unless \`?image=none\`: the descent left no image (the agent found neither the guest nor an image, and reported the loss first with \`guest-lost\`), so no host is named and a resume boots fresh without fetching. Any other \`image\` value is a 400 naming \`image\`.${hostOrAdmin}`,
      ),
    ),
    HttpApiEndpoint.delete("end", "/v1/sessions/:id", { params: PathId, success: Session, error: StandardErrors }).annotateMerge(
      doc(
          "End a session",
          `\`→ ended\` from any state: its reservation is released and an open move aborted; then the queue is drained. Idempotent: ending an ended session answers it as it is (200) and changes nothing.${hostOrAdmin}`,
        ),
    ),
    HttpApiEndpoint.put("ttl", "/v1/sessions/:id/ttl", { params: PathId, payload: SetTtl, success: Session, error: BodyErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(
        doc(
          "Set a session's TTL",
          `The session ends \`ttlMs\` from now (an integer from 1 ms to 10 years), whatever its state: extends or shortens its lifetime. Answers the session with its new \`endsAt\`. 409 on an ended session.${admin}`,
        ),
      ),
    HttpApiEndpoint.post("move", "/v1/sessions/:id/move", { params: PathId, payload: StartMove, success: MoveCommitted, error: BodyErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(
        doc(
          "Move a running session live",
          `Begins a move to \`targetHostId\` (default: the best-ranked host that takes moves, its agent advertising a peer URL; none with room is 409 \`Refused\` \`no_fit\`) within \`maxDowntimeMs\` and waits for its outcome: 200 \`{move, downtimeMs, captureMs, sendMs, commitMs}\` when committed (by its source; the four figures null when it was committed on a resolution, \`POST /v1/moves/{id}/resolve\` by its target or the admin, its pause not measured); 503 \`ErrMoveDowntime\` with \`estimateMs\` and no \`Retry-After\` when the downtime guard refused it (the session runs on the source; the same move is refused again: raise \`maxDowntimeMs\` or move when the guest dirties less), \`MoveAborted\` (its message the abort's reason, an operator's resolution included), \`MoveTimeout\` when no agent acted in time, or \`MoveCommitPending\` when the source recorded its final round but has not committed yet (\`GET /v1/moves/{id}\` shows the outcome).${admin}`,
        ),
      ),
  )
  .middleware(StrictInput)
  .middleware(BearerAuth) {}
