CREATE TABLE "hosts" (
	"id" text PRIMARY KEY NOT NULL,
	"labels" jsonb DEFAULT '{}'::jsonb NOT NULL,
	"state" text DEFAULT 'ready' NOT NULL,
	"token_hash" text,
	"total_mib" double precision,
	"allocatable_mib" double precision,
	"total_vcpus" bigint,
	"reported_at" bigint,
	"created_at" bigint NOT NULL,
	CONSTRAINT "hosts_state_check" CHECK ("hosts"."state" in ('ready', 'cordoned', 'draining')),
	CONSTRAINT "hosts_total_mib_check" CHECK ("hosts"."total_mib" is null or "hosts"."total_mib" >= 0),
	CONSTRAINT "hosts_allocatable_mib_check" CHECK ("hosts"."allocatable_mib" is null or "hosts"."allocatable_mib" >= 0),
	CONSTRAINT "hosts_total_vcpus_check" CHECK ("hosts"."total_vcpus" is null or "hosts"."total_vcpus" >= 0)
);
--> statement-breakpoint
CREATE TABLE "metrics" (
	"shard" smallint NOT NULL,
	"total_reserved_mib" double precision DEFAULT 0 NOT NULL,
	"total_released_mib" double precision DEFAULT 0 NOT NULL,
	"total_reclaimed_mib" double precision DEFAULT 0 NOT NULL,
	"reserve_failures" bigint DEFAULT 0 NOT NULL,
	CONSTRAINT "metrics_shard_pk" PRIMARY KEY("shard"),
	CONSTRAINT "metrics_shard_check" CHECK ("metrics"."shard" >= 0 and "metrics"."shard" < 64),
	CONSTRAINT "metrics_nonnegative_check" CHECK ("metrics"."total_reserved_mib" >= 0 and "metrics"."total_released_mib" >= 0 and "metrics"."total_reclaimed_mib" >= 0 and "metrics"."reserve_failures" >= 0)
);
--> statement-breakpoint
CREATE TABLE "moves" (
	"id" text PRIMARY KEY NOT NULL,
	"session_id" text NOT NULL,
	"source_host_id" text NOT NULL,
	"target_host_id" text NOT NULL,
	"reservation_id" text NOT NULL,
	"max_downtime_ms" double precision NOT NULL,
	"state" text NOT NULL,
	"rounds" jsonb DEFAULT '[]'::jsonb NOT NULL,
	"phases" jsonb,
	"abort_reason" text,
	"created_at" bigint NOT NULL,
	"ended_at" bigint,
	CONSTRAINT "moves_state_check" CHECK ("moves"."state" in ('pending', 'committed', 'aborted')),
	CONSTRAINT "moves_max_downtime_check" CHECK ("moves"."max_downtime_ms" > 0),
	CONSTRAINT "moves_target_check" CHECK ("moves"."source_host_id" <> "moves"."target_host_id")
);
--> statement-breakpoint
CREATE TABLE "reservations" (
	"id" text PRIMARY KEY NOT NULL,
	"host_id" text NOT NULL,
	"owner_kind" text NOT NULL,
	"owner_id" text NOT NULL,
	"mem_mib" double precision NOT NULL,
	"vcpus" double precision NOT NULL,
	"vram_mib" double precision,
	"created_at" bigint NOT NULL,
	"last_heartbeat_at" bigint NOT NULL,
	"expires_at" double precision,
	"description" text,
	CONSTRAINT "reservations_owner_kind_check" CHECK ("reservations"."owner_kind" in ('session', 'move', 'capture', 'external')),
	CONSTRAINT "reservations_mem_mib_check" CHECK ("reservations"."mem_mib" > 0),
	CONSTRAINT "reservations_vcpus_check" CHECK ("reservations"."vcpus" >= 0),
	CONSTRAINT "reservations_vram_mib_check" CHECK ("reservations"."vram_mib" is null or "reservations"."vram_mib" >= 0)
);
--> statement-breakpoint
CREATE TABLE "sessions" (
	"id" text PRIMARY KEY NOT NULL,
	"state" text NOT NULL,
	"mem_mib" bigint NOT NULL,
	"vcpus" bigint NOT NULL,
	"affinity" text[] DEFAULT '{}'::text[] NOT NULL,
	"host_id" text,
	"reservation_id" text,
	"queued_at" bigint,
	"parked_at" bigint,
	"created_at" bigint NOT NULL,
	"updated_at" bigint NOT NULL,
	CONSTRAINT "sessions_state_check" CHECK ("sessions"."state" in ('queued', 'pending', 'running', 'parked', 'descending', 'descended', 'moving', 'ended', 'lost')),
	CONSTRAINT "sessions_mem_mib_check" CHECK ("sessions"."mem_mib" > 0),
	CONSTRAINT "sessions_vcpus_check" CHECK ("sessions"."vcpus" >= 1),
	CONSTRAINT "sessions_queued_check" CHECK ("sessions"."state" <> 'queued' or "sessions"."queued_at" is not null)
);
--> statement-breakpoint
ALTER TABLE "moves" ADD CONSTRAINT "moves_session_id_sessions_id_fk" FOREIGN KEY ("session_id") REFERENCES "public"."sessions"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "reservations" ADD CONSTRAINT "reservations_host_id_hosts_id_fk" FOREIGN KEY ("host_id") REFERENCES "public"."hosts"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
ALTER TABLE "sessions" ADD CONSTRAINT "sessions_host_id_hosts_id_fk" FOREIGN KEY ("host_id") REFERENCES "public"."hosts"("id") ON DELETE no action ON UPDATE no action;--> statement-breakpoint
CREATE UNIQUE INDEX "moves_open_idx" ON "moves" USING btree ("session_id") WHERE "moves"."state" = 'pending';--> statement-breakpoint
CREATE INDEX "reservations_host_idx" ON "reservations" USING btree ("host_id");--> statement-breakpoint
CREATE INDEX "reservations_owner_idx" ON "reservations" USING btree ("owner_id");--> statement-breakpoint
CREATE INDEX "sessions_queue_idx" ON "sessions" USING btree ("queued_at","id") WHERE "sessions"."state" = 'queued';--> statement-breakpoint
CREATE INDEX "sessions_host_idx" ON "sessions" USING btree ("host_id") WHERE "sessions"."host_id" is not null;--> statement-breakpoint
CREATE INDEX "sessions_created_idx" ON "sessions" USING btree ("created_at","id");