// Imported first by every engram entry point (`import "@engram/process/check-node"`): on a
// Node.js older than engram supports, the process ends here, before any other module runs,
// with one line naming the version it needs and how to get it (see node-version.js).
import { exitIfUnsupported } from "./node-version.js"

exitIfUnsupported()
