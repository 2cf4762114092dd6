/**
 * A request that fails its schema, as a refusal names it: the field (a dotted path, `affinity.2`)
 * and the rule it broke. The coordinator answers `400 {error, field, rule, in}` with it; the
 * client refuses a request it cannot encode with the same words before sending anything.
 */
import { SchemaAST, SchemaIssue } from "effect"

/** Where a value was: the body, the query string, the path or the headers. */
export type InputLocation = "body" | "query" | "path" | "headers"

/** A key as a refusal names it: itself, or `""` for the empty key (a field is never named by nothing). */
export const keyName = (key: string): string => (key === "" ? '""' : key)

/** The keys an object schema declares, for a refusal that says what would have been accepted. */
const knownKeys = (ast: SchemaAST.AST): string => (SchemaAST.isObjects(ast) ? ast.propertySignatures.map((p) => String(p.name)).join(", ") : "")

/** The rule a failed check states: Effect's words, except for a key that is missing or unknown. */
const leafRule =
  (where: InputLocation) =>
  (issue: SchemaIssue.Leaf): string => {
    if (issue._tag === "MissingKey") return "is required"
    if (issue._tag === "UnexpectedKey") {
      const known = knownKeys(issue.ast)
      const what = where === "query" ? "a query parameter of this endpoint" : "a key of this object"
      return known === "" ? `is not ${what}` : `is not ${what} (known: ${known})`
    }
    return SchemaIssue.defaultLeafHook(issue)
  }

const formatters = {
  body: SchemaIssue.makeFormatterStandardSchemaV1({ leafHook: leafRule("body") }),
  query: SchemaIssue.makeFormatterStandardSchemaV1({ leafHook: leafRule("query") }),
  path: SchemaIssue.makeFormatterStandardSchemaV1({ leafHook: leafRule("path") }),
  headers: SchemaIssue.makeFormatterStandardSchemaV1({ leafHook: leafRule("headers") }),
}

/** The first thing `issue` refuses in a request's `where`: its field (`where` itself when it has no path) and rule. */
export const firstIssue = (issue: SchemaIssue.Issue, where: InputLocation): { readonly field: string; readonly rule: string } => {
  const first = formatters[where](issue).issues[0]
  const path = first?.path?.map((p) => keyName(typeof p === "object" && p !== null ? String((p as { key: unknown }).key) : String(p))) ?? []
  return { field: path.length > 0 ? path.join(".") : where, rule: first?.message ?? "is invalid" }
}
