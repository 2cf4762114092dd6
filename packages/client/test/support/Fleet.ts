// The coordinator and the hand-driven agent side these tests use (see @engram/test-fleet).
import { fleet } from "@engram/test-fleet"

export { uid } from "@engram/test-fleet"
export const { adminToken, call, start, addHost, started, pendingMove } = fleet("client-test-admin-token-0123456789")
