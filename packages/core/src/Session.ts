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

/**
 * The store operations that change a session's state, each with the states it starts from and
 * the state it leads to. The life cycle alone cannot tell `markRunning` from `unpark` (both go
 * to running) or `resume` from a queue drain (both go to pending); these rules can, so every
 * store refuses the same calls.
 */
export const operations = {
  markRunning: { from: ["pending"], to: ["running"] },
  idle: { from: ["running"], to: ["parked", "descending"] },
  unpark: { from: ["parked"], to: ["running"] },
  beginDescent: { from: ["parked"], to: ["descending"] },
  finishDescent: { from: ["descending"], to: ["descended"] },
  resume: { from: ["descended"], to: ["pending", "queued"] },
  beginMove: { from: ["running"], to: ["moving"] },
  end: { from: ["queued", "pending", "running", "parked", "descending", "descended", "moving", "lost"], to: ["ended"] },
} as const satisfies Record<string, { readonly from: readonly State[]; readonly to: readonly State[] }>

/** A state-changing store operation. */
export type Operation = keyof typeof operations

/**
 * Judges `op` on a session in `from` that would lead to `to`: legal only when the operation
 * starts from `from` and the life cycle allows `from → to`.
 */
export const apply = (op: Operation, from: State, to: State): Transition => {
  const rule = operations[op]
  if (!(rule.from as readonly State[]).includes(from))
    return {
      _tag: "Illegal",
      from,
      to,
      message: `${op} needs a session in ${rule.from.join(" or ")}, not ${from} (cannot go from ${from} to ${to})`,
    }
  if (!(rule.to as readonly State[]).includes(to))
    return { _tag: "Illegal", from, to, message: `${op} leads to ${rule.to.join(" or ")}, not ${to}` }
  return transition(from, to)
}
