-- Data migration: the maintained sums of existing hosts, from the ledger through the one
-- computation of them (the view host_reserved_sums). Hosts without entries keep 0.
UPDATE "hosts" SET
	"reserved_mem_mib" = s."mem_mib",
	"reserved_vcpus" = s."vcpus",
	"entries" = s."entries",
	"version" = "hosts"."version" + 1
FROM "host_reserved_sums" s
WHERE s."host_id" = "hosts"."id";
