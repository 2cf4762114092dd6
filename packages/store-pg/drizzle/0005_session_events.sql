CREATE TABLE "session_events" (
	"session_id" text NOT NULL,
	"seq" integer NOT NULL,
	"at" bigint NOT NULL,
	"event" jsonb NOT NULL,
	CONSTRAINT "session_events_session_id_seq_pk" PRIMARY KEY("session_id","seq"),
	CONSTRAINT "session_events_seq_check" CHECK ("session_events"."seq" >= 1)
);
