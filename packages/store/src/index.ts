/**
 * @engram/store: the one store interface of engram, its records, its typed errors and the
 * change notices that wake whoever waits on the store.
 */
export * from "./Changes.js"
export * from "./Errors.js"
export * from "./Store.js"
export * from "./Types.js"
export * as Cursor from "./Cursor.js"
export * as Validate from "./Validate.js"
