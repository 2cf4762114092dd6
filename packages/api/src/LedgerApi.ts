/** The reservation ledger (SPEC §3): external and capture reservations, summaries and metrics. */
import { HttpApiEndpoint, HttpApiGroup, HttpApiSchema } from "effect/http-api"
import { BodyErrors, StandardErrors } from "./Errors.js"
import { doc } from "./internal/doc.js"
import { PathId, ReservationsQuery, Reserve } from "./Payloads.js"
import { ClusterSummary, LedgerMetrics, Reservation, ReservationsPage } from "./Records.js"
import { AdminOnly, BearerAuth, StrictInput } from "./Security.js"

const admin = " Admin only."

/** `/v1/reservations…` and `/v1/ledger…`. */
export class LedgerApi extends HttpApiGroup.make("ledger")
  .add(
    HttpApiEndpoint.post("reserve", "/v1/reservations", { payload: Reserve, success: Reservation.pipe(HttpApiSchema.status(201)), error: BodyErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(
        doc(
          "Reserve room on a host",
          `A \`capture\` or \`external\` reservation (sessions and moves reserve through placement). Its expiry: \`expiresAt\` (epoch ms; null or absent: none), or \`expiresInMs\` from now on the coordinator's clock (an integer from 1 ms to 10 years; not with \`expiresAt\`), so a client whose clock is off sets it right. Refusals are 409 \`{error: "Refused", check}\` naming the check (\`capacity_exceeded\`, \`entries_full\`, \`host_not_ready\` — an external reservation lands only on a ready host —, …); a repeated id is a 409 Conflict.${admin}`,
        ),
      ),
    HttpApiEndpoint.get("list", "/v1/reservations", { query: ReservationsQuery, success: ReservationsPage, error: StandardErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(doc("List reservations", `A page of reservations by id, every host's or one's (\`hostId\`): \`{items, nextCursor}\`; \`?limit=&cursor=\` as every list.${admin}`)),
    HttpApiEndpoint.get("get", "/v1/reservations/:id", { params: PathId, success: Reservation, error: StandardErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(doc("Read a reservation", `One reservation.${admin}`)),
    HttpApiEndpoint.delete("release", "/v1/reservations/:id", { params: PathId, success: Reservation, error: StandardErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(
        doc("Release a reservation", `Releases a capture or external reservation (a session's or move's refuses with 409: end the session or abort the move); then the queue is drained.${admin}`),
      ),
    HttpApiEndpoint.post("heartbeat", "/v1/reservations/:id/heartbeat", { params: PathId, success: Reservation, error: StandardErrors }).annotateMerge(
      doc("Heartbeat a reservation", "Renews one reservation. The admin, or the token of the reservation's host."),
    ),
    HttpApiEndpoint.get("summary", "/v1/ledger/summary", { success: ClusterSummary, error: StandardErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(doc("The ledger's summary", `Per host and for the cluster: total, reserved and VRAM MiB, active and stale entries, utilization.${admin}`)),
    HttpApiEndpoint.get("metrics", "/v1/ledger/metrics", { success: LedgerMetrics, error: StandardErrors })
      .middleware(StrictInput)
      .middleware(AdminOnly)
      .annotateMerge(doc("The ledger's cumulative metrics", `Reserved, released and reclaimed MiB, reserve failures, active entries.${admin}`)),
  )
  .middleware(StrictInput)
  .middleware(BearerAuth) {}
