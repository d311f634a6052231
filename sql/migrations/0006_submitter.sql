-- Who sent each event (HealthEvent.submitter, stamped by the gateway from
-- the authenticated credential): the credential's name (never its secret),
-- its role as the SubmitterRole enum name (SUBMITTER_ROLE_AGENT,
-- SUBMITTER_ROLE_OPERATOR, SUBMITTER_ROLE_PIPELINE for the correlator's
-- derived events) and the node it is bound to. All three are '' for an
-- event without a submitter and for the rows stored before this migration
-- (the processors count such events as the agent's).
--
-- Plain String columns with the type's default (no DEFAULT expression).
-- ClickHouse 18.16 has no ADD COLUMN IF NOT EXISTS: the three columns are
-- added by one ALTER, which is applied whole or not at all, and the
-- migration runner takes "column already exists" on such an ALTER as
-- already applied, so a re-run is harmless.
ALTER TABLE events
    ADD COLUMN submitter_name String,
    ADD COLUMN submitter_role String,
    ADD COLUMN submitter_node String;
