/**
 * @engram/dashboard: the live dashboard at `/ui`, as routes a coordinator mounts
 * (`Dashboard.layer({ authorize, version })`). The page (assets/) is plain JavaScript and CSS
 * with no dependencies, served from the coordinator itself (no CDN).
 */
export * as Dashboard from "./Dashboard.js"
