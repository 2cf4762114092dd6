/**
 * In-doubt moves under faults, end to end (SPEC §13): a real coordinator and two agent processes
 * on the simulated runtime. A move's source records its intent (the point of no return) with
 * the guest still running, pauses 1.5 s later (`pauseDelayMs`, as QEMU stops the guest at its
 * next iteration), sends, and records the final round's figures once the target (a 2.5 s
 * commit) runs the guest. The source or the target is struck at one of two points: **between the
 * intent and the pause**, or **after the pause, before the final round's record** (the source's
 * copy paused, the target committing): frozen (SIGSTOP) for twice the stale window, then
 * continued; or killed (SIGKILL) and started again on its own state directory. Every try: the
 * session is never `lost` meanwhile, the move ends (committed, or aborted with the guest on the
 * source), and the guest runs exactly once, on the host the store places it on. The whole run is
 * recorded (the client's creates and ends, the agents' reports of the guests they run and the
 * guests gone from them, the moves' outcomes) and the fault suite's checker reads it: among its
 * rules, no guest an agent reported running was destroyed without an end or abort.
 * `ENGRAM_FAULT_TRIES` (default 1 per point, side and fault) sets how many tries.
 *
 * With `ENGRAM_AGENT_MOVE_INTENT=1` on the agents; **not in the default run** (set
 * `ENGRAM_FAULT_INTENT=1`): its strike points are real-time windows (the 1.5 s between the intent
 * and the pause, the 2.5 s commit), which a loaded machine can miss. The states they reach are
 * covered deterministically on the TestClock in `MoveGuard.test.ts` (the intent's describes).
 * The default run's `indoubt-faults.test.ts` covers the default protocol (no intent); the run
 * itself is `support/InDoubtFaults.ts`, shared with it.
 */
import { expect } from "vitest"
import { sleep } from "./support/E2e.js"
import { inDoubtFaultRun, roundKinds } from "./support/InDoubtFaults.js"

inDoubtFaultRun({
  title: "a peer frozen or killed past the move's intent (ENGRAM_FAULT_INTENT=1)",
  enabled: process.env["ENGRAM_FAULT_INTENT"] === "1",
  tries: Number(process.env["ENGRAM_FAULT_TRIES"] ?? 1),
  agentEnv: {
    ENGRAM_AGENT_MOVE_INTENT: "1",
    // Seconds-wide windows: between the intent and the pause (1.5 s), and after the pause
    // (the target's commit, 2.5 s) before the final round's record.
    ENGRAM_SIM: JSON.stringify({ commitMs: 2500, pauseDelayMs: 1500 }),
  },
  points: [
    {
      label: "between the intent and the pause",
      sessions: "intent-",
      // Once the coordinator holds the move's intent while the source's guest still runs.
      reach: async (run, src, id) => {
        const move = await run.moveWithRound(src, id, "intent")
        expect(roundKinds(move), `${id}: the intent was not seen: ${JSON.stringify(move)}`).toContain("intent")
        // The pause follows the intent by 1.5 s: struck at once, the source's guest still runs (not
        // asserted: a status read on a loaded machine may take longer than that).
        return move
      },
    },
    {
      label: "after the pause, before the final round's record",
      sessions: "paused-",
      // Once the source's guest is paused for the move while the final round is not recorded yet.
      reach: async (run, src, id) => {
        for (const deadline = Date.now() + 30_000; Date.now() < deadline; await sleep(10)) {
          const g = (await run.agents[src]!.status()).vms.find((v: { vmId: string }) => v.vmId === id) as { status: string; moveId: string | null } | undefined
          if (g?.status === "paused" && g.moveId === null) break
        }
        const move = await run.moveOf(src, id)
        expect(roundKinds(move), `${id}: paused past the intent, before the final round: ${JSON.stringify(move)}`).toContain("intent")
        expect(roundKinds(move)).not.toContain("final")
        return move
      },
    },
  ],
})
