/**
 * In-doubt moves under faults, end to end (SPEC §13): a real coordinator and two agent processes
 * on the simulated runtime. Right after a move's final round is recorded, the source or the
 * target is frozen (SIGSTOP) for twice the stale window, then continued; or killed (SIGKILL) and
 * started again on its own state directory. Every try: the session is never `lost` meanwhile,
 * the move ends (committed, or aborted with the guest on the source), and the guest runs exactly
 * once, on the host the store places it on. The whole run is recorded (the client's creates and
 * ends, the agents' reports of the guests they run and the guests gone from them, the moves'
 * outcomes) and the fault suite's checker reads it: among its rules, no guest an agent reported
 * running was destroyed without an end or abort. `ENGRAM_FAULT_TRIES` (default 2 per side and
 * fault) sets how many tries. The run itself is `support/InDoubtFaults.ts`, shared with
 * `indoubt-faults-intent.test.ts`.
 */
import { inDoubtFaultRun } from "./support/InDoubtFaults.js"

inDoubtFaultRun({
  title: "a peer frozen or killed right after the final round is recorded",
  tries: Number(process.env["ENGRAM_FAULT_TRIES"] ?? 2),
  agentEnv: {
    // A slow commit on the target: the window after the final round is seconds wide.
    ENGRAM_SIM: JSON.stringify({ commitMs: 2500 }),
  },
  points: [
    {
      sessions: "",
      // The move's final round recorded: strike the peer at once.
      reach: (run, src, id) => run.moveWithRound(src, id, "final"),
    },
  ],
})
