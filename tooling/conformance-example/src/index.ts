/** A store backend checked by `@engram/store-conformance`, as its README tells an outsider. */
export * as JournalStore from "./JournalStore.js"
