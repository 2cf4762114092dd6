-- Data migration: the image host of each session descended before image hosts were recorded,
-- from its history: a session descended, queued or pending whose last `Descended` event comes
-- after its last `Running` one (it has not run since) holds its image on that event's host.
-- Without it such a session would rank no host first. A queued or pending create keeps null.
-- Driven from the sessions in those states, each one's last such event found by the events'
-- primary key (session_id, seq) walked backwards: the cost follows the live sessions, not the
-- whole history (the migration runs in one transaction, holding `sessions` until it commits).
UPDATE "sessions" SET "image_host_id" = d."host_id"
FROM (
	SELECT s."id" AS "session_id", last."tag", last."host_id"
	FROM "sessions" s
	CROSS JOIN LATERAL (
		SELECT e."event"->>'_tag' AS "tag", e."event"->>'hostId' AS "host_id"
		FROM "session_events" e
		WHERE e."session_id" = s."id" AND e."event"->>'_tag' IN ('Descended', 'Running')
		ORDER BY e."seq" DESC
		LIMIT 1
	) last
	WHERE s."state" IN ('descended', 'queued', 'pending') AND s."image_host_id" IS NULL
) d
WHERE d."session_id" = "sessions"."id"
	AND d."tag" = 'Descended'
	AND d."host_id" IS NOT NULL;
