// Shared lint rules for every @engram package: the recommended sets plus the few
// rules that catch the mistakes this codebase cares about (floating promises are
// caught by Effect's types instead, so no type-aware rules: lint stays fast).
import js from "@eslint/js"
import tseslint from "typescript-eslint"

export default tseslint.config(
  { ignores: ["**/dist/**", "**/dist-sea/**", "**/node_modules/**", "**/.turbo/**", "**/drizzle/**"] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    rules: {
      "@typescript-eslint/no-unused-vars": ["error", { argsIgnorePattern: "^_", varsIgnorePattern: "^_" }],
      "@typescript-eslint/consistent-type-imports": "error",
      "@typescript-eslint/no-explicit-any": "error",
      "no-console": ["error", { allow: ["warn", "error"] }],
      eqeqeq: ["error", "always", { null: "ignore" }],
    },
  },
  {
    files: ["**/test/**", "**/bench/**", "**/scripts/**"],
    rules: { "no-console": "off" },
  },
)
