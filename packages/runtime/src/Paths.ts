/**
 * Ids as file names: a VM's, an image's or a template's directory is its id, encoded, under a
 * directory of the runtime's.
 */

/**
 * `id` as one path segment (`encodeURIComponent`: no `/`, no NUL). Throws for an id that would
 * name the directory it is put under, or its parent (`""`, `.`, `..`): callers check ids by
 * core's id rule first, and this keeps a file operation (a removal, above all) inside its
 * directory whatever reached it.
 */
export const pathSegment = (id: string): string => {
  const segment = encodeURIComponent(id)
  if (segment === "" || segment === "." || segment === "..") throw new Error(`${JSON.stringify(id)} cannot name a file: it would name its directory or the one above`)
  return segment
}
