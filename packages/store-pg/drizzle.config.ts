import { defineConfig } from "drizzle-kit"

// `pnpm db:generate` writes a new migration to drizzle/ from src/schema.ts; `pnpm db:check`
// verifies the committed migrations are consistent. Migrations are applied by the store's
// `migrate` at layer start, never with `push`.
export default defineConfig({
  dialect: "postgresql",
  schema: "./src/schema.ts",
  out: "./drizzle",
})
