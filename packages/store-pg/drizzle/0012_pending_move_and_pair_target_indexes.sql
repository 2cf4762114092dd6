CREATE INDEX "move_pairs_target_idx" ON "move_pairs" USING btree ("target_host_id","updated_at");--> statement-breakpoint
CREATE INDEX "moves_source_pending_idx" ON "moves" USING btree ("source_host_id") WHERE "moves"."state" = 'pending';--> statement-breakpoint
CREATE INDEX "moves_target_pending_idx" ON "moves" USING btree ("target_host_id") WHERE "moves"."state" = 'pending';