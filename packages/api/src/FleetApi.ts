/** The fleet signal, the queue with where each session stands, and the no-fit details of a budget. Admin only. */
import { HttpApiEndpoint, HttpApiGroup } from "effect/http-api"
import { StandardErrors } from "./Errors.js"
import { doc } from "./internal/doc.js"
import { NoFitQuery, PageQuery } from "./Payloads.js"
import { Fleet, NoFit, QueuePage } from "./Records.js"
import { AdminOnly, BearerAuth, StrictInput } from "./Security.js"

/** `/v1/fleet`, `/v1/queue` and `/v1/placement/no-fit`. */
export class FleetApi extends HttpApiGroup.make("fleet")
  .add(
    HttpApiEndpoint.get("snapshot", "/v1/fleet", { success: Fleet, error: StandardErrors }).annotateMerge(
      doc(
        "The fleet signal",
        "One fleet read summed by core `Fleet.snapshot`: hosts by state, capacity, reserved and free RAM and vCPUs, the queue (sessions, demand, `withoutRoom`: the cue for more hosts; a host whose agent went silent, past the stale window, is no room there, nor for the others a host placement claims for a session starving past the starvation limit: the park gate's count), the silent hosts (`hosts.silent`: any state; `hosts.readySilent`: those among `ready`, which still counts them; `silentFreeMib` and `silentFreeVcpus`: their part of `freeMib` and `freeVcpus`, room no placement can use until their agents report), `unplaceable` (queued sessions no host could take even empty, and the largest such budget: the cue for a bigger host), parks, descents running, and when the fleet was read. The autoscaling cue. Admin only.",
      ),
    ),
    HttpApiEndpoint.get("queue", "/v1/queue", { query: PageQuery, success: QueuePage, error: StandardErrors }).annotateMerge(
      doc(
        "The queue",
        "A page of the queued sessions, first in first out: each session with `queue: {position, noFit, tooBig}` — its 1-based position, why each host does not take it now, and whether it is too big for every host even when empty. `{items, nextCursor}`; `?limit=&cursor=` as every list. Admin only.",
      ),
    ),
    HttpApiEndpoint.get("noFit", "/v1/placement/no-fit", { query: NoFitQuery, success: NoFit, error: StandardErrors }).annotateMerge(
      doc("Would this budget fit?", "`{fits, hosts}`: whether `memMib`/`vcpus` would place now, and each candidate host's reason and free room (SPEC §2). Admin only."),
    ),
  )
  .middleware(StrictInput)
  .middleware(AdminOnly)
  .middleware(BearerAuth) {}
