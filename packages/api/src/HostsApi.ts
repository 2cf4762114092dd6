/**
 * Hosts: registration (which answers the host's own token), removal, token rotation, the
 * agent's report and heartbeat, the administrative states, and the agent's assignments long-poll.
 */
import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema } from "effect/http-api"
import { BodyErrors, LongPollErrors, StandardErrors } from "./Errors.js"
import { doc } from "./internal/doc.js"
import { AllowancesQuery, AssignmentsQuery, CreateHost, GuestLost, maxReasonLength, PageQuery, PathId, Report } from "./Payloads.js"
import { Assignments, HeartbeatRenewed, Host, HostAllowances, HostCreated, HostsPage, HostToken, Session } from "./Records.js"
import { AdminOnly, BearerAuth, StrictInput } from "./Security.js"

const admin = " Admin only."
const hostOrAdmin = " The admin, or this host's own token."

/** `/v1/hosts…`. */
export class HostsApi extends HttpApiGroup.make("hosts")
  .add(
    HttpApiEndpoint.post("create", "/v1/hosts", { payload: CreateHost, success: HostCreated.pipe(HttpApiSchema.status(201)), error: BodyErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(
        doc(
          "Register a host",
          `Registers a host (\`id\`: 1-100 characters of \`[A-Za-z0-9._-]\`, not \`.\` or \`..\`; optional \`labels\`) and answers 201 \`{id, token}\`: the host agent's own token, answered this once (only its SHA-256 is stored). Registration is not readiness: the host takes placements only after its first report. 409 when the id exists.${admin}`,
        ),
      ),
    HttpApiEndpoint.get("list", "/v1/hosts", { query: PageQuery, success: HostsPage, error: StandardErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(
        doc(
          "List hosts",
          `A page of hosts by id, each with its room (capacity after policy, reserved, free RAM and vCPUs, entries, parks, descents): \`{items, nextCursor}\`; \`?limit=&cursor=\` as every list.${admin}`,
        ),
      ),
    HttpApiEndpoint.delete("remove", "/v1/hosts/:id", { params: PathId, success: Host, error: StandardErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(
        doc(
          "Remove a host",
          `Removes a host that holds nothing and answers it as it was. 409 \`{error: "Refused", check: "host_in_use"}\` while it holds a reservation or a session (end, move or let them descend first); its token stops working with it.${admin}`,
        ),
      ),
    HttpApiEndpoint.post("rotateToken", "/v1/hosts/:id/token", { params: PathId, success: HostToken, error: StandardErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(
        doc(
          "Rotate a host's token",
          `Issues the host a new token and answers \`{id, token}\` this once (only its SHA-256 is stored). The old token stops working at once, on every replica, and so does the host's running agent: its next call is refused (401) and it exits (exit 3). Restart it with the new token within the heartbeat stale window (\`ENGRAM_HEARTBEAT_STALE_WINDOW_MS\`, default 120000 ms: 2 min) or its heartbeats go stale and its sessions are reclaimed (lost).${admin}`,
        ),
      ),
    HttpApiEndpoint.get("get", "/v1/hosts/:id", { params: PathId, success: Host, error: StandardErrors }).annotateMerge(
      doc("Read a host", `One host with its room. \`allocatableMib\` is the capacity after policy (SPEC §1), \`reportedAllocatableMib\` what the host reported.${hostOrAdmin}`),
    ),
    HttpApiEndpoint.get("allowances", "/v1/hosts/:id/allowances", { params: PathId, query: AllowancesQuery, success: HostAllowances, error: StandardErrors }).middleware(StrictInput).annotateMerge(
      doc(
        "A host's learned commit allowances",
        `The downtime guard's commit allowance of moves from this host, per target host it has committed moves to (SPEC §13): a high quantile of recent commit phases: the pair's own (\`commitsMs\`, oldest first, recorded at \`recordedAtMs\`) when it has enough within \`horizonMs\` (\`source: learned\`), else pooled with recent commits into the same target (\`target\`) or of the whole fleet (\`fleet\`); a pool counts only when it holds 5 recent commits; \`priorMs\` (the configured \`commitAllowanceMs\`) when the pair has none and no pool counts (\`prior\`). With \`targetHostId\`, only the pair to that host, listed (\`commitsMs: []\`, \`updatedAt: null\`) even without commits of its own.${hostOrAdmin}`,
      ),
    ),
    HttpApiEndpoint.put("report", "/v1/hosts/:id/report", { params: PathId, payload: Report, success: Host, error: BodyErrors }).annotateMerge(
      doc(
        "Report what a host measured",
        `The agent's measurement: \`totalMib\`, \`allocatableMib\` (MemAvailable plus the RAM of the resident VMs) and \`totalVcpus\`; null or absent = not measured (the host takes placements, ranked last, its RAM not gated), \`allocatableMib: 0\` = full. The first report makes the host take placements. Answers the host; then the queue is drained.${hostOrAdmin}`,
      ),
    ),
    HttpApiEndpoint.post("heartbeat", "/v1/hosts/:id/heartbeat", { params: PathId, success: HeartbeatRenewed, error: StandardErrors }).annotateMerge(
      doc("Heartbeat a host's reservations", `Renews every session, move and capture reservation held on the host; answers how many.${hostOrAdmin}`),
    ),
    HttpApiEndpoint.post("guestLost", "/v1/hosts/:id/guest-lost", { params: PathId, payload: GuestLost, success: Session, error: BodyErrors }).annotateMerge(
      doc(
        "Report a session's guest lost",
        `The host's agent lost the guest of \`sessionId\` (its VM ended by itself — a hypervisor that crashed or was killed —, was not found where the agent recorded it, or, for a resumed session, its descent image could not be fetched from the host holding it within the agent's deadline) and boots a fresh one in its place: the session's memory state is gone. Recorded in the session's history as \`guest_lost\` with this host and \`reason\` (1 to ${maxReasonLength} characters); the session's state does not change. Answers the session. Only a session on this host now, or one its latest committed move took away from this host (a report that waited while the move committed: recorded with that move's \`moveId\` and \`toHostId\`, the copy lost being this host's, before the move; the session runs on where it is): one on another host otherwise, or on none, is a 409 naming where it is, an ended one a 409, an unknown one a 404; nothing is written.${hostOrAdmin}`,
      ),
    ),
    HttpApiEndpoint.post("cordon", "/v1/hosts/:id/cordon", { params: PathId, success: Host, error: StandardErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(doc("Cordon a host", `The host takes no new placements; what runs there stays.${admin}`)),
    HttpApiEndpoint.post("uncordon", "/v1/hosts/:id/uncordon", { params: PathId, success: Host, error: StandardErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(doc("Uncordon a host", `The host is ready again; then the queue is drained.${admin}`)),
    HttpApiEndpoint.post("drain", "/v1/hosts/:id/drain", { params: PathId, success: Host, error: StandardErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(doc("Drain a host", `The host takes no new placements (state \`draining\`).${admin}`)),
    HttpApiEndpoint.get("assignments", "/v1/hosts/:id/assignments", { params: PathId, query: AssignmentsQuery, success: Assignments, error: LongPollErrors }).annotateMerge(
      doc(
        "A host's assignments (agent long-poll)",
        `The host's desired state: its sessions in pending, running, parked, descending or moving, the pending moves where it is source or target (oldest first), and the limits its move guard uses. \`version\` changes whenever they change; with \`waitMs\` (at most 30000) the request answers as soon as the version differs from \`since\` (or from the version when it arrived), else when \`waitMs\` runs out (a little early rather than late: by up to a twentieth of it, at most 1 s). Woken by the change itself, through any replica. A host token holds at most a few long-polls open at once (\`ENGRAM_MAX_WAITS_PER_HOST_TOKEN\`); beyond it, or beyond the coordinator's total, 429 \`TooManyWaits\` with \`Retry-After\`. When the token is rotated or the host removed, an open long-poll answers 401 at once.${hostOrAdmin}`,
      ),
    ),
  )
  .middleware(StrictInput)
  .middleware(BearerAuth) {}
