-- The correlation rules' verdicts: the derived events (derived_by != ''),
-- copied from events by a materialized view as they are inserted. The
-- correlate role reads a rule's standing verdicts here on every batch
-- (priors, suppressions, the sweep): they are a tiny fraction of events,
-- and this key finds them without reading the events of every node a batch
-- touches. Same partitions and retention as events; deduplicate with
-- LIMIT 1 BY id / argMax like events.
CREATE TABLE IF NOT EXISTS derived_events
(
    cluster String,
    node String,
    check String,
    entity String,
    ts DateTime,
    ts_ms UInt16,
    id String,
    received DateTime,
    is_healthy UInt8,
    entities Nested(type String, value String),
    metadata Nested(key String, value String),
    derived_by String
)
ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(received)
ORDER BY (derived_by, check, cluster, node, entity, ts, ts_ms, id)
SETTINGS index_granularity = 1024;

CREATE MATERIALIZED VIEW IF NOT EXISTS derived_events_mv TO derived_events AS
SELECT cluster, node, check, entity, ts, ts_ms, id, received, is_healthy,
    entities.type, entities.value, metadata.key, metadata.value, derived_by
FROM events
WHERE derived_by != '';

-- Backfill what events already holds (duplicates are absorbed like
-- events' own).
INSERT INTO derived_events (cluster, node, check, entity, ts, ts_ms, id, received, is_healthy,
    entities.type, entities.value, metadata.key, metadata.value, derived_by)
SELECT cluster, node, check, entity, ts, ts_ms, id, received, is_healthy,
    entities.type, entities.value, metadata.key, metadata.value, derived_by
FROM events
WHERE derived_by != '';
