/**
 * A seeded random source and the distributions the workload generator draws from. sfc32
 * seeded through splitmix32: fast, 128 bits of state, and the same stream on every machine.
 */

/** A seeded stream of uniform numbers in [0, 1) with the draws the generator needs. */
export class Rng {
  private a: number
  private b: number
  private c: number
  private d: number

  constructor(seed: number) {
    let s = seed >>> 0
    const next = (): number => {
      s = (s + 0x9e3779b9) >>> 0
      let z = s
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0
      return (z ^ (z >>> 16)) >>> 0
    }
    this.a = next()
    this.b = next()
    this.c = next()
    this.d = next()
    for (let i = 0; i < 12; i++) this.uniform()
  }

  /** Uniform in [0, 1). */
  uniform(): number {
    const t = (((this.a + this.b) >>> 0) + this.d) >>> 0
    this.d = (this.d + 1) >>> 0
    this.a = this.b ^ (this.b >>> 9)
    this.b = (this.c + (this.c << 3)) >>> 0
    this.c = ((this.c << 21) | (this.c >>> 11)) >>> 0
    this.c = (this.c + t) >>> 0
    return t / 4294967296
  }

  /** Uniform in (0, 1]: safe under a logarithm or a root. */
  private open(): number {
    return 1 - this.uniform()
  }

  /** A standard normal draw (Box–Muller). */
  normal(): number {
    return Math.sqrt(-2 * Math.log(this.open())) * Math.cos(2 * Math.PI * this.uniform())
  }

  /** Lognormal with the given median and shape (σ of the underlying normal). */
  lognormal(median: number, sigma: number): number {
    return median * Math.exp(sigma * this.normal())
  }

  /** Pareto with scale `min` (the smallest value) and shape `alpha`: a heavy tail. */
  pareto(min: number, alpha: number): number {
    return min / Math.pow(this.open(), 1 / alpha)
  }

  /** True with probability `p`. */
  chance(p: number): boolean {
    return this.uniform() < p
  }

  /** An index drawn in proportion to `weights`. */
  weighted(weights: readonly number[]): number {
    let total = 0
    for (const w of weights) total += w
    let x = this.uniform() * total
    for (let i = 0; i < weights.length; i++) {
      x -= weights[i] as number
      if (x < 0) return i
    }
    return weights.length - 1
  }
}
