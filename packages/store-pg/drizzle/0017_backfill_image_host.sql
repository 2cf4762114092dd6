-- Data migration: the image host of each session descended before image hosts were recorded,
-- from its history: a session descended, queued or pending whose last `Descended` event comes
-- after its last `Running` one (it has not run since) holds its image on that event's host.
-- Without it such a session would rank no host first, and an agent that removes the images of
-- sessions not listed as its own would remove its memory. A queued or pending create keeps null.
UPDATE "sessions" SET "image_host_id" = d."host_id"
FROM (
	SELECT DISTINCT ON (e."session_id") e."session_id", e."event"->>'_tag' AS "tag", e."event"->>'hostId' AS "host_id"
	FROM "session_events" e
	WHERE e."event"->>'_tag' IN ('Descended', 'Running')
	ORDER BY e."session_id", e."seq" DESC
) d
WHERE d."session_id" = "sessions"."id"
	AND d."tag" = 'Descended'
	AND d."host_id" IS NOT NULL
	AND "sessions"."state" IN ('descended', 'queued', 'pending')
	AND "sessions"."image_host_id" IS NULL;
