CREATE INDEX "hosts_token_hash_idx" ON "hosts" USING btree ("token_hash") WHERE "hosts"."token_hash" is not null;--> statement-breakpoint
CREATE INDEX "moves_created_idx" ON "moves" USING btree ("created_at","id");--> statement-breakpoint
CREATE INDEX "moves_source_idx" ON "moves" USING btree ("source_host_id");--> statement-breakpoint
CREATE INDEX "moves_target_idx" ON "moves" USING btree ("target_host_id");