#!/usr/bin/env -S tsx --conditions=@engram/source
// Builds the test guest into its cache and prints its files: `pnpm --filter @engram/guest build-guest`.
import { ensureGuest } from "./Guest.js"

const guest = await ensureGuest({ log: (l) => console.error(l) })
console.error(JSON.stringify(guest, null, 2))
