ALTER TABLE "hosts" ADD COLUMN "reserved_mem_mib" numeric DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "hosts" ADD COLUMN "reserved_vcpus" numeric DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "hosts" ADD COLUMN "entries" integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "hosts" ADD COLUMN "version" bigint DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE "hosts" ADD CONSTRAINT "hosts_reserved_sums_check" CHECK ("hosts"."reserved_mem_mib" >= 0 and "hosts"."reserved_vcpus" >= 0 and "hosts"."entries" >= 0);--> statement-breakpoint
CREATE VIEW "public"."host_reserved_sums" AS (select host_id, sum(mem_mib::numeric) as mem_mib, sum(vcpus::numeric) as vcpus, count(*)::int as entries
    from reservations group by host_id);