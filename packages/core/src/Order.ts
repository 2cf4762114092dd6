/** The orders every list of engram is sorted in: ids compared as strings, by code unit. */

/** Compares two ids (or any strings) by code unit, as `Array.prototype.sort` does. */
export const compareIds = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0)

/** Records by their `id`. */
export const byId = (a: { readonly id: string }, b: { readonly id: string }): number => compareIds(a.id, b.id)
