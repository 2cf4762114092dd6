/**
 * Sessions: create (placed or queued), read, the agent's acknowledgements (`started`,
 * `descended`), idle (the park gate decides), resume, end, and a live move that waits for its
 * outcome.
 */
import { Schema } from "effect"
import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema } from "effect/http-api"
import { BodyErrors, StandardErrors } from "./Errors.js"
import { doc } from "./internal/doc.js"
import { CreateSession, PathId, SessionsQuery, StartMove } from "./Payloads.js"
import { Idled, MoveCommitted, Placed, Queued, Session } from "./Records.js"
import { AdminOnly, BearerAuth } from "./Security.js"

const admin = " Admin only."
const hostOrAdmin = " The admin, or the token of the session's host."

/** 201 placed or 202 queued. */
const PlaceAnswers = [Placed.pipe(HttpApiSchema.status(201)), Queued.pipe(HttpApiSchema.status(202))] as const

/** `/v1/sessions…`. */
export class SessionsApi extends HttpApiGroup.make("sessions")
  .add(
    HttpApiEndpoint.post("create", "/v1/sessions", { payload: CreateSession, success: PlaceAnswers, error: BodyErrors })
      .middleware(AdminOnly)
      .annotateMerge(
        doc(
          "Create a session",
          `Places a session of \`{memMib, vcpus}\` on the best-fitting ready host (\`affinity\` hosts first): 201 \`{id, state, hostId}\`. When nothing fits it is queued: 202 \`{id, state: "queued", position, noFit}\` with each host's reason (\`ram_full\`, \`cpu_full\`, \`entries_full\`, \`unmeasured\`, \`cordoned\`, \`draining\`, \`fits_now\`). Without \`id\` a UUID is generated; a repeated \`id\` answers the existing session, and a different budget under it is a 409.${admin}`,
        ),
      ),
    HttpApiEndpoint.get("list", "/v1/sessions", { query: SessionsQuery, success: Schema.Array(Session), error: StandardErrors }).annotateMerge(
      doc("List sessions", "Sessions, oldest first, filtered by `state` and `hostId`. Admin, or a host's token with its own `hostId`."),
    ),
    HttpApiEndpoint.get("get", "/v1/sessions/:id", { params: PathId, success: Session, error: StandardErrors }).annotateMerge(
      doc("Read a session", `The session's state, budget, host and reservation.${hostOrAdmin}`),
    ),
    HttpApiEndpoint.post("idle", "/v1/sessions/:id/idle", { params: PathId, success: Idled, error: StandardErrors }).annotateMerge(
      doc(
        "A running session went idle",
        `The park gate decides on one fleet read: it parks (paused in RAM, keeps its reservation) on a measured host while no queued session is without room, else it descends (captured to storage, its room released). Answers \`{id, state}\`.${hostOrAdmin}`,
      ),
    ),
    HttpApiEndpoint.post("resume", "/v1/sessions/:id/resume", { params: PathId, success: PlaceAnswers, error: StandardErrors })
      .middleware(AdminOnly)
      .annotateMerge(doc("Resume a descended session", `Places the session again from its descent image: 201 or 202, as create. 409 unless it is descended.${admin}`)),
    HttpApiEndpoint.post("started", "/v1/sessions/:id/started", { params: PathId, success: Session, error: StandardErrors }).annotateMerge(
      doc("The agent started the session's VM", `\`pending → running\`; a repeat is a 409 (the agent counts it as done).${hostOrAdmin}`),
    ),
    HttpApiEndpoint.post("descended", "/v1/sessions/:id/descended", { params: PathId, success: Session, error: StandardErrors }).annotateMerge(
      doc("The agent stored the session's capture", `\`descending → descended\`: the reservation is released; then the queue is drained.${hostOrAdmin}`),
    ),
    HttpApiEndpoint.delete("end", "/v1/sessions/:id", { params: PathId, success: Session, error: StandardErrors }).annotateMerge(
      doc("End a session", `\`→ ended\` from any state: its reservation is released and an open move aborted; then the queue is drained.${hostOrAdmin}`),
    ),
    HttpApiEndpoint.post("move", "/v1/sessions/:id/move", { params: PathId, payload: StartMove, success: MoveCommitted, error: BodyErrors })
      .middleware(AdminOnly)
      .annotateMerge(
        doc(
          "Move a running session live",
          `Begins a move to \`targetHostId\` (default: the best-ranked host) within \`maxDowntimeMs\` and waits for its outcome: 200 \`{move, downtimeMs, captureMs, sendMs, commitMs}\` when committed; 503 \`ErrMoveDowntime\` with \`estimateMs\` when the downtime guard refused it (the session runs on the source), \`MoveAborted\`, \`MoveTimeout\` when no agent acted in time, or \`MoveCommitPending\` when the source recorded its final round but has not committed yet (\`GET /v1/moves/{id}\` shows the outcome).${admin}`,
        ),
      ),
  )
  .middleware(BearerAuth) {}
