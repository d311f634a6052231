-- The correlation windows' working set: the raw, actionable events
-- (derived_by = '' and not STORE_ONLY, the only ones a rule counts) of the
-- last days, copied from events by a materialized view as they are inserted
-- (same insert, so a row is in recent_events as soon as it is in events).
--
-- Ordered by (check, ts, ...), not by node: a batch touches events of a
-- large part of the fleet, so the node cannot prune, but every rule window
-- is a short time range of a few checks, which this key reads directly.
-- Partitioned by the day the gateway received the event (server time: a
-- bad agent clock cannot scatter rows); retention drops days older than
-- clickhouse.RecentRetention (8 days), longer than any events window
-- (24h + the 3h sticky Xid horizon). Deduplicate like events: LIMIT 1 BY id.
CREATE TABLE IF NOT EXISTS recent_events
(
    cluster String,
    node String,
    check String,
    entity String,
    ts DateTime,
    ts_ms UInt16,
    id String,
    received DateTime,
    is_fatal UInt8,
    is_healthy UInt8,
    error_codes Array(String),
    entities Nested(type String, value String),
    metadata Nested(key String, value String),
    processing_strategy String,
    derived_by String
)
ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMMDD(received)
ORDER BY (check, ts, ts_ms, cluster, node, entity, id)
SETTINGS index_granularity = 1024;

CREATE MATERIALIZED VIEW IF NOT EXISTS recent_events_mv TO recent_events AS
SELECT cluster, node, check, entity, ts, ts_ms, id, received, is_fatal, is_healthy, error_codes,
    entities.type, entities.value, metadata.key, metadata.value, processing_strategy, derived_by
FROM events
WHERE derived_by = '' AND processing_strategy != 'STORE_ONLY';

-- Backfill what events already holds (a re-run or a row inserted meanwhile
-- duplicates rows, which LIMIT 1 BY id absorbs).
INSERT INTO recent_events (cluster, node, check, entity, ts, ts_ms, id, received, is_fatal, is_healthy, error_codes,
    entities.type, entities.value, metadata.key, metadata.value, processing_strategy, derived_by)
SELECT cluster, node, check, entity, ts, ts_ms, id, received, is_fatal, is_healthy, error_codes,
    entities.type, entities.value, metadata.key, metadata.value, processing_strategy, derived_by
FROM events
WHERE received >= now() - INTERVAL 8 DAY AND derived_by = '' AND processing_strategy != 'STORE_ONLY';
