import base from "@engram/eslint-config"

// The page's script runs in a browser.
const browser = Object.fromEntries(["document", "window", "sessionStorage", "fetch", "setTimeout", "clearTimeout", "URL", "URLSearchParams", "location", "console", "performance"].map((g) => [g, "readonly"]))

export default [...base, { files: ["assets/**/*.js"], languageOptions: { globals: browser, sourceType: "module" } }]
