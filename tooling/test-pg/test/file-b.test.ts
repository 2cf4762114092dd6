import { describe } from "vitest"
import { exercise } from "./support/exercise.js"

describe("test file B", () => exercise("file-b"))
