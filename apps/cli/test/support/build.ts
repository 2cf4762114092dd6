// Vitest global setup: builds the runnable `engram` (dist/main.js, one bundled file) once for
// every test file, so the tests run what users run, and each command starts in well under a
// second (from source through tsx it takes seconds).
export default async function setup(): Promise<void> {
  await import("../../scripts/build-bin.js")
}
