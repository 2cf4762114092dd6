/**
 * A census of this process's JS heap by constructor (a V8 heap snapshot, parsed here): how
 * many objects of each kind and their own bytes. Two censuses subtracted say what a load added
 * (`waiter-memory.ts` with `WAITER_CENSUS=1`: what N open long-polls hold, kind by kind).
 */
import { getHeapSnapshot } from "node:v8"

export type Census = Map<string, { count: number; bytes: number }>

interface Snapshot {
  readonly snapshot: { readonly meta: { readonly node_fields: string[]; readonly node_types: [string[], ...unknown[]] } }
  readonly nodes: number[]
  readonly strings: string[]
}

/** Objects by `type:name` (closures by their function's name), with their count and self size. */
export const census = async (): Promise<Census> => {
  const chunks: string[] = []
  for await (const c of getHeapSnapshot()) chunks.push(String(c))
  const s = JSON.parse(chunks.join("")) as Snapshot
  const fields = s.snapshot.meta.node_fields
  const types = s.snapshot.meta.node_types[0]
  const width = fields.length
  const [typeAt, nameAt, sizeAt] = [fields.indexOf("type"), fields.indexOf("name"), fields.indexOf("self_size")]
  const out: Census = new Map()
  const kindOf = (i: number): string => {
    const type = types[s.nodes[i + typeAt] as number] ?? "?"
    const name = type === "object" || type === "closure" ? (s.strings[s.nodes[i + nameAt] as number] ?? "?") : ""
    return `${type}${name === "" ? "" : `:${name}`}`
  }
  // `HEAP_CENSUS_OWNERS=1`: arrays and closure contexts are named by the first object that holds them (`array<-object:Map`).
  const owners = new Map<number, string>()
  if (process.env["HEAP_CENSUS_OWNERS"] === "1") {
    const full = s as Snapshot & { readonly edges: number[]; readonly snapshot: { readonly meta: { readonly edge_fields: string[] } } }
    const edgeWidth = full.snapshot.meta.edge_fields.length
    const [countAt, toAt] = [fields.indexOf("edge_count"), full.snapshot.meta.edge_fields.indexOf("to_node")]
    let e = 0
    for (let i = 0; i < s.nodes.length; i += width) {
      const owner = kindOf(i)
      for (let k = 0; k < (s.nodes[i + countAt] as number); k++, e += edgeWidth) {
        const to = full.edges[e + toAt] as number
        if (!owners.has(to) && !owner.startsWith("array") && !owner.startsWith("hidden") && !owner.startsWith("synthetic")) owners.set(to, owner)
      }
    }
  }
  for (let i = 0; i < s.nodes.length; i += width) {
    const own = kindOf(i)
    const owner = own === "array" || own === "object:system / Context" || own === "object:Map" || own === "object:Set" || own === "object:Object" ? owners.get(i) : undefined
    const key = owner === undefined ? own : `${own}<-${owner}`
    const row = out.get(key) ?? { count: 0, bytes: 0 }
    row.count++
    row.bytes += s.nodes[i + sizeAt] as number
    out.set(key, row)
  }
  return out
}

/** The kinds that grew most from `before` to `after`, per `per` (e.g. per waiter): `[kind, count, bytes]`. */
export const growth = (before: Census, after: Census, per: number, top = 30): [string, number, number][] =>
  [...after]
    .map(([k, a]): [string, number, number] => {
      const b = before.get(k) ?? { count: 0, bytes: 0 }
      return [k, (a.count - b.count) / per, (a.bytes - b.bytes) / per]
    })
    .sort((x, y) => y[2] - x[2])
    .slice(0, top)
