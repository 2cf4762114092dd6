CREATE SEQUENCE "public"."hosts_version_seq" INCREMENT BY 1 MINVALUE 1 MAXVALUE 9223372036854775807 START WITH 1 CACHE 1;--> statement-breakpoint
ALTER TABLE "hosts" ALTER COLUMN "version" SET DEFAULT nextval('hosts_version_seq');--> statement-breakpoint
-- Versions from the sequence start above every version a host row has now: a bump never goes back.
SELECT setval('hosts_version_seq', coalesce((SELECT max("version") FROM "hosts"), 0) + 1, false);
