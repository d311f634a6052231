-- The fault history: every HealthEvent, raw and derived, one row per
-- delivery. The store processor writes at-least-once, so a row can exist
-- more than once until a background merge collapses it (ReplacingMergeTree
-- keyed by the sorting key, which ends in the event id): every query must
-- count uniqExact(id) or read with LIMIT 1 BY id, never count().
--
-- Partitioned by the month the gateway received the event (server time, so a
-- bad agent clock cannot scatter rows over hundreds of partitions); retention
-- drops whole months. Ordered for the correlation windows:
-- (cluster, node, check, entity, time). A window reads a few index granules
-- per part; 1024-row granules (not the default 8192) keep that small.
CREATE TABLE IF NOT EXISTS events
(
    cluster String,
    node String,
    -- checkName
    check String,
    -- all impacted entities as "TYPE=value,TYPE=value" (events.EntityKey)
    entity String,
    -- generatedTimestamp (the gateway's received time when absent): seconds
    -- and the milliseconds within the second
    ts DateTime,
    ts_ms UInt16,
    -- UUIDv7 text assigned by the gateway
    id String,
    received DateTime,
    received_ms UInt16,
    -- 1 when the event carried no generatedTimestamp
    ts_missing UInt8,
    version UInt32,
    agent String,
    component_class String,
    is_fatal UInt8,
    is_healthy UInt8,
    message String,
    -- RecommendedAction enum name (or its number when unknown)
    recommended_action String,
    custom_recommended_action String,
    error_codes Array(String),
    entities Nested(type String, value String),
    metadata Nested(key String, value String),
    -- BehaviourOverrides: *_set is 1 when the message was present
    quarantine_set UInt8,
    quarantine_force UInt8,
    quarantine_skip UInt8,
    drain_set UInt8,
    drain_force UInt8,
    drain_skip UInt8,
    -- ProcessingStrategy enum name
    processing_strategy String,
    -- correlation rule that produced a derived event ('' for raw events)
    derived_by String,
    cause_ids Array(String),
    -- when the store processor wrote this copy
    stored DateTime DEFAULT now()
)
ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(received)
ORDER BY (cluster, node, check, entity, ts, ts_ms, id)
SETTINGS index_granularity = 1024;
