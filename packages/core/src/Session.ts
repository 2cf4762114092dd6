/**
 * The session life cycle (SPEC §2): the states and the legal transitions. Every store runs
 * each state change through `transition`, so an illegal one is refused the same way everywhere.
 */

/** A session's state. */
export type State = "queued" | "pending" | "running" | "parked" | "descending" | "descended" | "moving" | "ended" | "lost"

/** Every state, in life-cycle order. */
export const states: readonly State[] = [
  "queued",
  "pending",
  "running",
  "parked",
  "descending",
  "descended",
  "moving",
  "ended",
  "lost",
]

const legal: { readonly [S in State]: readonly State[] } = {
  queued: ["pending", "ended"],
  pending: ["running", "ended", "lost"],
  running: ["parked", "descending", "moving", "ended", "lost"],
  parked: ["running", "descending", "ended", "lost"],
  descending: ["descended", "ended", "lost"],
  descended: ["queued", "pending", "ended"],
  moving: ["running", "ended", "lost"],
  ended: [],
  lost: ["ended"],
}

/** The states reachable from `from` in one step. */
export const next = (from: State): readonly State[] => legal[from]

/** Whether `from → to` is a legal transition. */
export const canTransition = (from: State, to: State): boolean => legal[from].includes(to)

/** The verdict on a transition. */
export type Transition =
  | { readonly _tag: "Legal"; readonly from: State; readonly to: State }
  | { readonly _tag: "Illegal"; readonly from: State; readonly to: State; readonly message: string }

/** Judges `from → to`; an illegal one carries a message naming both states and what is allowed. */
export const transition = (from: State, to: State): Transition =>
  canTransition(from, to)
    ? { _tag: "Legal", from, to }
    : {
        _tag: "Illegal",
        from,
        to,
        message: `session cannot go from ${from} to ${to}${legal[from].length > 0 ? ` (from ${from}: ${legal[from].join(", ")})` : ` (${from} is final)`}`,
      }

/** Whether a session in this state holds a reservation on a host. */
export const holdsReservation = (s: State): boolean =>
  s === "pending" || s === "running" || s === "parked" || s === "descending" || s === "moving"

/** Whether the state is final. */
export const isFinal = (s: State): boolean => s === "ended"
