// The OpenAPI summary and description of one operation.
import { OpenApi } from "effect/http-api"

/** Annotations for an endpoint's reference entry: a one-line summary and a description. */
export const doc = (summary: string, description: string) => OpenApi.annotations({ summary, description })
