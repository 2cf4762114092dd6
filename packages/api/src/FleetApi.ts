/** The fleet signal and the no-fit details of a budget. Admin only. */
import { HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
import { StandardErrors } from "./Errors.js"
import { doc } from "./internal/doc.js"
import { NoFitQuery } from "./Payloads.js"
import { Fleet, NoFit } from "./Records.js"
import { AdminOnly, BearerAuth } from "./Security.js"

/** `/v1/fleet` and `/v1/placement/no-fit`. */
export class FleetApi extends HttpApiGroup.make("fleet")
  .add(
    HttpApiEndpoint.get("snapshot", "/v1/fleet", { success: Fleet, error: StandardErrors }).annotateMerge(
      doc(
        "The fleet signal",
        "One fleet read summed by core `Fleet.snapshot`: hosts by state, capacity, reserved and free RAM and vCPUs, the queue (sessions, demand, `withoutRoom`), parks, descents running, and when the fleet was read. The autoscaling cue. Admin only.",
      ),
    ),
    HttpApiEndpoint.get("noFit", "/v1/placement/no-fit", { query: NoFitQuery, success: NoFit, error: StandardErrors }).annotateMerge(
      doc("Would this budget fit?", "`{fits, hosts}`: whether `memMib`/`vcpus` would place now, and each candidate host's reason and free room (SPEC §2). Admin only."),
    ),
  )
  .middleware(AdminOnly)
  .middleware(BearerAuth) {}
