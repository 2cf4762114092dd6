CREATE TABLE "move_pairs" (
	"source_host_id" text NOT NULL,
	"target_host_id" text NOT NULL,
	"commits_ms" jsonb DEFAULT '[]'::jsonb NOT NULL,
	"updated_at" bigint NOT NULL,
	CONSTRAINT "move_pairs_source_host_id_target_host_id_pk" PRIMARY KEY("source_host_id","target_host_id")
);
--> statement-breakpoint
ALTER TABLE "moves" ADD COLUMN "guard" jsonb;