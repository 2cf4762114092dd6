/**
 * How far V8 lets the coordinator's JS heap grow past what it holds alive before it collects
 * the old generation again. V8's own rule lets the heap reach up to 4× the live set after each
 * full collection when collecting is cheap against the program's allocation, which is the case
 * for a coordinator holding thousands of agents' long-polls: with 10,000 agents on the fleet
 * bench (a live set of about 320–460 MiB) the heap in use climbed to 1.2 GiB and the process's
 * RSS to 1.4 GiB before a full collection brought the heap back to 440 MiB (and V8 kept the
 * pages). The coordinator's start (`main.ts`) sets the factor to 1.5×: the heap then stays within
 * half its live set above it (RSS 632–646 MiB at 10,000 agents, at the cost of a few more full
 * collections: 10–25 % more of the coordinator's CPU in that bench). It is not a cap: a
 * coordinator whose live set grows (a larger fleet, a `/v1/fleet` over many sessions) grows its
 * heap with it, and never stops for want of heap.
 *
 * An operator who wants another factor starts Node with `--heap-growing-percent=<n>` (V8's flag;
 * `0` is V8's own rule; Node refuses it in `NODE_OPTIONS`): the coordinator then leaves it alone.
 */

/** The heap may grow to (1 + this ÷ 100) × its live set after a full collection. */
export const defaultHeapGrowingPercent = 50

/** The V8 flag the coordinator's start sets, or null when the process was started with its own. */
export const heapGrowingFlag = (execArgv: readonly string[]): string | null =>
  execArgv.some((a) => /^--heap[-_]growing[-_]percent(=|$)/.test(a)) ? null : `--heap-growing-percent=${defaultHeapGrowingPercent}`
