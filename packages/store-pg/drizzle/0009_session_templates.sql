ALTER TABLE "hosts" ADD COLUMN "templates" jsonb DEFAULT '[]'::jsonb NOT NULL;--> statement-breakpoint
ALTER TABLE "sessions" ADD COLUMN "template" text;