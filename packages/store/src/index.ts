/**
 * @engram/store: the one store interface of engram, its records and its typed errors.
 */
export * from "./Errors.js"
export * from "./Store.js"
export * from "./Types.js"
export * from "./Leadership.js"
export * as Cursor from "./Cursor.js"
export * as Validate from "./Validate.js"
