-- 0001_events.sql
CREATE TABLE IF NOT EXISTS faultline.events_local ON CLUSTER 'fleet'
(
    cluster String,
    node String,
    check String,
    entity String,
    ts DateTime,
    ts_ms UInt16,
    id String,
    received DateTime,
    received_ms UInt16,
    ts_missing UInt8,
    version UInt32,
    agent String,
    component_class String,
    is_fatal UInt8,
    is_healthy UInt8,
    message String,
    recommended_action String,
    custom_recommended_action String,
    error_codes Array(String),
    entities Nested(type String, value String),
    metadata Nested(key String, value String),
    quarantine_set UInt8,
    quarantine_force UInt8,
    quarantine_skip UInt8,
    drain_set UInt8,
    drain_force UInt8,
    drain_skip UInt8,
    processing_strategy String,
    derived_by String,
    cause_ids Array(String),
    stored DateTime DEFAULT now()
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/faultline/events_local', '{replica}')
PARTITION BY toYYYYMM(received)
ORDER BY (cluster, node, check, entity, ts, ts_ms, id)
SETTINGS index_granularity = 1024;
CREATE TABLE IF NOT EXISTS faultline.events ON CLUSTER 'fleet' AS faultline.events_local ENGINE = Distributed('fleet', faultline, events_local, cityHash64(cluster, node));
-- 0002_actions.sql
CREATE TABLE IF NOT EXISTS faultline.actions_local ON CLUSTER 'fleet'
(
    cluster String,
    node String,
    ts DateTime,
    ts_ms UInt16,
    id String,
    role String,
    kind String,
    outcome String,
    reason String,
    rule String,
    event_ids Array(String),
    dry_run UInt8,
    details Nested(key String, value String),
    check String,
    recommended_action String,
    received DateTime,
    stored DateTime DEFAULT now()
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/faultline/actions_local', '{replica}')
PARTITION BY toYYYYMM(received)
ORDER BY (cluster, node, ts, ts_ms, id);
CREATE TABLE IF NOT EXISTS faultline.actions ON CLUSTER 'fleet' AS faultline.actions_local ENGINE = Distributed('fleet', faultline, actions_local, cityHash64(cluster, node));
-- 0003_conformance.sql
CREATE TABLE IF NOT EXISTS faultline.conformance_local ON CLUSTER 'fleet'
(
    cluster String,
    node String,
    ts DateTime,
    ts_ms UInt16,
    id String,
    fingerprint String,
    components Nested(name String, version String),
    received DateTime,
    stored DateTime DEFAULT now()
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/faultline/conformance_local', '{replica}')
PARTITION BY toYYYYMM(received)
ORDER BY (cluster, node, ts, ts_ms, id);
CREATE TABLE IF NOT EXISTS faultline.conformance ON CLUSTER 'fleet' AS faultline.conformance_local ENGINE = Distributed('fleet', faultline, conformance_local, cityHash64(cluster, node));
-- 0004_recent_events.sql
CREATE TABLE IF NOT EXISTS faultline.recent_events_local ON CLUSTER 'fleet'
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/faultline/recent_events_local', '{replica}')
PARTITION BY toYYYYMMDD(received)
ORDER BY (check, ts, ts_ms, cluster, node, entity, id)
SETTINGS index_granularity = 1024;
CREATE TABLE IF NOT EXISTS faultline.recent_events ON CLUSTER 'fleet' AS faultline.recent_events_local ENGINE = Distributed('fleet', faultline, recent_events_local, cityHash64(cluster, node));
CREATE MATERIALIZED VIEW IF NOT EXISTS faultline.recent_events_mv ON CLUSTER 'fleet' TO faultline.recent_events_local AS SELECT cluster, node, check, entity, ts, ts_ms, id, received, is_fatal, is_healthy, error_codes,
    entities.type, entities.value, metadata.key, metadata.value, processing_strategy, derived_by
FROM faultline.events_local
WHERE derived_by = '' AND processing_strategy != 'STORE_ONLY';
INSERT INTO recent_events (cluster, node, check, entity, ts, ts_ms, id, received, is_fatal, is_healthy, error_codes,
    entities.type, entities.value, metadata.key, metadata.value, processing_strategy, derived_by)
SELECT cluster, node, check, entity, ts, ts_ms, id, received, is_fatal, is_healthy, error_codes,
    entities.type, entities.value, metadata.key, metadata.value, processing_strategy, derived_by
FROM events
WHERE received >= now() - INTERVAL 8 DAY AND derived_by = '' AND processing_strategy != 'STORE_ONLY';
-- 0005_derived_events.sql
CREATE TABLE IF NOT EXISTS faultline.derived_events_local ON CLUSTER 'fleet'
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
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/faultline/derived_events_local', '{replica}')
PARTITION BY toYYYYMM(received)
ORDER BY (derived_by, check, cluster, node, entity, ts, ts_ms, id)
SETTINGS index_granularity = 1024;
CREATE TABLE IF NOT EXISTS faultline.derived_events ON CLUSTER 'fleet' AS faultline.derived_events_local ENGINE = Distributed('fleet', faultline, derived_events_local, cityHash64(cluster, node));
CREATE MATERIALIZED VIEW IF NOT EXISTS faultline.derived_events_mv ON CLUSTER 'fleet' TO faultline.derived_events_local AS SELECT cluster, node, check, entity, ts, ts_ms, id, received, is_healthy,
    entities.type, entities.value, metadata.key, metadata.value, derived_by
FROM faultline.events_local
WHERE derived_by != '';
INSERT INTO derived_events (cluster, node, check, entity, ts, ts_ms, id, received, is_healthy,
    entities.type, entities.value, metadata.key, metadata.value, derived_by)
SELECT cluster, node, check, entity, ts, ts_ms, id, received, is_healthy,
    entities.type, entities.value, metadata.key, metadata.value, derived_by
FROM events
WHERE derived_by != '';
-- 0006_submitter.sql
ALTER TABLE faultline.events_local ON CLUSTER 'fleet' ADD COLUMN submitter_name String,
    ADD COLUMN submitter_role String,
    ADD COLUMN submitter_node String;
DROP TABLE IF EXISTS faultline.events ON CLUSTER 'fleet';
CREATE TABLE IF NOT EXISTS faultline.events ON CLUSTER 'fleet' AS faultline.events_local ENGINE = Distributed('fleet', faultline, events_local, cityHash64(cluster, node));
