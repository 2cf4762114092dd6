-- A host token authenticates one host: the token hash index becomes unique. The drop comes first:
-- it holds `hosts` alone (ACCESS EXCLUSIVE) until the migration commits, so no write comes between
-- the check and the new index. Hashes held by several hosts (never from random tokens) are not
-- resolved here, as which host keeps its token is the operator's choice: the migration fails
-- naming the rule and the hosts, and nothing is applied (one transaction). Rotate the token of
-- all but one host of each (`POST /v1/hosts/<id>/token` on the release before), then start again.
DROP INDEX "hosts_token_hash_idx";--> statement-breakpoint
DO $$
DECLARE
	shared_hashes integer;
	named text;
BEGIN
	SELECT count(*), string_agg(d."ids", '; ') FILTER (WHERE d."n" <= 10)
	INTO shared_hashes, named
	FROM (
		SELECT row_number() OVER (ORDER BY min("id")) AS "n", string_agg("id", ', ' ORDER BY "id") AS "ids"
		FROM "hosts" WHERE "token_hash" IS NOT NULL
		GROUP BY "token_hash" HAVING count(*) > 1
	) d;
	IF shared_hashes > 0 THEN
		RAISE EXCEPTION 'migration 0021_token_hash_unique: hosts.token_hash must be unique (a host token authenticates one host), but % token hash(es) are held by several hosts (hosts sharing one: %): rotate the token of all but one host of each (POST /v1/hosts/<id>/token) and migrate again; nothing was applied',
			shared_hashes, named || CASE WHEN shared_hashes > 10 THEN '; …' ELSE '' END
			USING ERRCODE = 'unique_violation';
	END IF;
END $$;--> statement-breakpoint
CREATE UNIQUE INDEX "hosts_token_hash_idx" ON "hosts" USING btree ("token_hash") WHERE "hosts"."token_hash" is not null;
