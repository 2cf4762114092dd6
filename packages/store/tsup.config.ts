import { library } from "@engram/tsup-config"
import { defineConfig } from "tsup"

export default defineConfig(library)
