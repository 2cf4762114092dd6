CREATE INDEX "moves_ended_idx" ON "moves" USING btree ("ended_at") WHERE "moves"."state" <> 'pending';--> statement-breakpoint
CREATE INDEX "moves_session_idx" ON "moves" USING btree ("session_id");--> statement-breakpoint
CREATE INDEX "moves_aborted_idx" ON "moves" USING btree ("ended_at") WHERE "moves"."state" = 'aborted';--> statement-breakpoint
CREATE INDEX "sessions_ended_idx" ON "sessions" USING btree ("updated_at") WHERE "sessions"."state" = 'ended';