import { describe } from "vitest"
import { exercise } from "./support/exercise.js"

describe("test file A", () => exercise("file-a"))
