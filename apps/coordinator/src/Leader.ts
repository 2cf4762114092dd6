/**
 * Reaper leadership. On PostgreSQL the leader is the replica holding a session-level
 * advisory lock on a dedicated connection (`max: 1`); every reaper interval a replica tries
 * to take it, and the leader checks it still holds it (same backend pid). When that
 * connection closes the replica stops leading at once (postgres.js `onclose`), so a replica
 * whose database link drops never reaps on a lock it no longer holds. An embedded store
 * (PGlite, or a store in this process) has one process: it always leads.
 */
import { Context, Duration, Effect, Layer } from "effect"
import postgres from "@engram/postgres"

/** The advisory lock key: "engram" in ASCII. */
export const lockKey = 0x656e6772616d

export interface LeaderShape {
  /** Tries to take (or confirms) the lock; answers whether this replica leads now. */
  readonly tick: Effect.Effect<boolean>
  /** Whether this replica leads right now; no I/O. */
  readonly isLeader: () => boolean
}

export class Leader extends Context.Service<Leader, LeaderShape>()("@engram/coordinator/Leader") {
  /** A single process: always the leader. */
  static readonly always: Layer.Layer<Leader> = Layer.succeed(Leader, Leader.of({ tick: Effect.succeed(true), isLeader: () => true }))

  /** Leadership through `pg_try_advisory_lock` on a dedicated connection to `url`. */
  static readonly postgres = (url: string, options: { readonly queryTimeoutMs?: number } = {}): Layer.Layer<Leader> =>
    Layer.effect(
      Leader,
      Effect.gen(function* () {
        let leader = false
        let heldByPid: number | null = null
        const sql = yield* Effect.acquireRelease(
          Effect.sync(() =>
            postgres(url, {
              max: 1,
              idle_timeout: 0,
              max_lifetime: null,
              connect_timeout: 5,
              onnotice: () => undefined,
              onclose: () => {
                // The session that held the lock is gone: stop at once.
                leader = false
                heldByPid = null
              },
            }),
          ),
          (sql) =>
            Effect.promise(async () => {
              if (leader) {
                leader = false
                await sql`select pg_advisory_unlock_all()`.catch(() => undefined)
              }
              await sql.end({ timeout: 2 }).catch(() => undefined)
            }),
        )
        const timeout = Duration.millis(options.queryTimeoutMs ?? 2000)
        const query = <A>(f: () => Promise<A>) =>
          Effect.tryPromise({ try: f, catch: (e) => e }).pipe(Effect.timeout(timeout))

        const tick = Effect.gen(function* () {
          if (leader && heldByPid !== null) {
            const rows = yield* query(() => sql<{ pid: number }[]>`select pg_backend_pid() as pid`)
            if (rows[0]?.pid === heldByPid && leader) return true
            leader = false
            heldByPid = null
          }
          const rows = yield* query(() => sql<{ locked: boolean; pid: number }[]>`select pg_try_advisory_lock(${lockKey}) as locked, pg_backend_pid() as pid`)
          const row = rows[0]
          if (row?.locked === true) {
            leader = true
            heldByPid = row.pid
          }
          return leader
        }).pipe(
          Effect.catch((e) =>
            Effect.gen(function* () {
              leader = false
              heldByPid = null
              yield* Effect.logWarning("reaper leader lock check failed; not leading", { error: e instanceof Error ? e.message : String(e) })
              return false
            }),
          ),
        )
        return Leader.of({ tick, isLeader: () => leader })
      }),
    )
}
