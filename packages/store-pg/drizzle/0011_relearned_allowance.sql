ALTER TABLE "move_pairs" ADD COLUMN "recorded_at_ms" jsonb DEFAULT '[]'::jsonb NOT NULL;--> statement-breakpoint
CREATE INDEX "move_pairs_updated_at_idx" ON "move_pairs" USING btree ("updated_at");--> statement-breakpoint
-- Data migration: commits kept before their times were take the pair's last commit time, so they
-- age out one horizon after it (the store reads the same when a time is missing).
UPDATE "move_pairs" SET "recorded_at_ms" = (
	SELECT coalesce(jsonb_agg(to_jsonb("updated_at") ORDER BY e.i), '[]'::jsonb)
	FROM jsonb_array_elements("commits_ms") WITH ORDINALITY AS e(v, i)
) WHERE jsonb_array_length("commits_ms") > 0;
