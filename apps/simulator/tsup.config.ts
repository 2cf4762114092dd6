import { library } from "@engram/tsup-config"
import { defineConfig } from "tsup"

export default defineConfig({ ...library, entry: ["src/index.ts", "src/main.ts", "src/SimWorker.ts"] })
