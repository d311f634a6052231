-- The audit trail: what the pipeline decided and did (faultline.v1.Action),
-- written by the store processor from the actions topic. As for events, a
-- row may exist more than once until merged: read with LIMIT 1 BY id or
-- uniqExact(id).
CREATE TABLE IF NOT EXISTS actions
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
ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(received)
ORDER BY (cluster, node, ts, ts_ms, id);
