// An id as a file name: it stays inside the directory it is put under, whatever reached it.
import { describe, expect, it } from "vitest"
import { ImageStore, pathSegment } from "../src/index.js"

describe("pathSegment", () => {
  it("encodes an id into one segment (no separator, no NUL)", () => {
    expect(pathSegment("s-1.a_b")).toBe("s-1.a_b")
    expect(pathSegment("a/b")).toBe("a%2Fb")
    expect(pathSegment("a\u0000b")).toBe("a%00b")
    expect(pathSegment("...")).toBe("...")
  })

  it("refuses an id that would name its directory or the one above: empty, . and ..", () => {
    for (const id of ["", ".", ".."]) expect(() => pathSegment(id), JSON.stringify(id)).toThrow(/cannot name a file/)
  })

  it("an image store keeps every image path inside its root, and refuses one that would leave it", () => {
    const store = ImageStore.directory("/images")
    expect(store.pathFor("s1")).toBe("/images/s1/image")
    expect(() => store.pathFor("..")).toThrow(/cannot name a file/)
  })
})
