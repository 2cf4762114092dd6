CREATE TABLE "leases" (
	"name" text PRIMARY KEY NOT NULL,
	"holder" text NOT NULL,
	"epoch" bigint NOT NULL,
	"renewals" bigint DEFAULT 0 NOT NULL,
	"lease_duration_ms" bigint NOT NULL,
	CONSTRAINT "leases_epoch_check" CHECK ("leases"."epoch" >= 1)
);
