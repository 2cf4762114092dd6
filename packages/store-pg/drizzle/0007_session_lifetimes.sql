ALTER TABLE "sessions" ADD COLUMN "idle_timeout_ms" bigint;--> statement-breakpoint
ALTER TABLE "sessions" ADD COLUMN "last_active_at" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "sessions" ADD COLUMN "ends_at" bigint;--> statement-breakpoint
CREATE INDEX "sessions_idle_idx" ON "sessions" USING btree (("last_active_at" + "idle_timeout_ms")) WHERE "sessions"."state" = 'running' and "sessions"."idle_timeout_ms" is not null;--> statement-breakpoint
CREATE INDEX "sessions_ends_idx" ON "sessions" USING btree ("ends_at") WHERE "sessions"."ends_at" is not null and "sessions"."state" <> 'ended';