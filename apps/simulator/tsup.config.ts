import { defineConfig } from "tsup"

export default defineConfig({
  entry: ["src/index.ts", "src/main.ts", "src/SimWorker.ts"],
  format: ["esm"],
  dts: true,
  clean: true,
  sourcemap: true,
  target: "node22",
})
