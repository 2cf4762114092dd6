/**
 * Sets kept by key (waiters by topic, open polls by host, token hashes by host): a key's set
 * exists only while it holds something, so a map of them grows with what is held, not with
 * every key ever seen.
 */

/** Adds `value` to the set of `key`. */
export const addTo = <K, V>(sets: Map<K, Set<V>>, key: K, value: V): void => {
  let set = sets.get(key)
  if (set === undefined) sets.set(key, (set = new Set()))
  set.add(value)
}

/** Removes `value` from the set of `key`, and the set once empty. */
export const removeFrom = <K, V>(sets: Map<K, Set<V>>, key: K, value: V): void => {
  const set = sets.get(key)
  if (set === undefined) return
  set.delete(value)
  if (set.size === 0) sets.delete(key)
}
