// `repeatedKey`: the first key a JSON text repeats within one object, as a path, whatever the
// nesting, the escapes, and strings that look like JSON.
import { describe, expect, it } from "vitest"
import { repeatedKey } from "../src/StrictJson.js"

describe("StrictJson.repeatedKey", () => {
  it.each([
    ['{"id":"a","id":"b"}', "id"],
    ['{"memMib":512,"vcpus":1,"memMib":1024}', "memMib"],
    ['{"id":"h","labels":{"zone":"a","zone":"b"}}', "labels.zone"],
    ['{"templates":[{"name":"a","memMib":1},{"name":"b","name":"c"}]}', "templates.1.name"],
    ['{"id":"a","\\u0069d":"b"}', "id"],
    ['{"a":{"x":1},"b":{"x":1},"a":2}', "a"],
    ['{"":1,"":2}', ""],
  ])("%s repeats %s", (json, key) => {
    expect(repeatedKey(json)).toBe(key)
  })

  it.each([
    '{"id":"a"}',
    '{"a":{"id":1},"b":{"id":1}}',
    '[{"id":1},{"id":2}]',
    '{"reason":"{\\"id\\":1,\\"id\\":2}","id":"x"}',
    '{"a":["id","id"],"id":1}',
    '{"a":"\\\\","b":"\\"}"}',
    "",
    "not json",
  ])("%s repeats none", (json) => {
    expect(repeatedKey(json)).toBeUndefined()
  })
})
