-- Conformance fingerprints reported by node agents (the conformance check):
-- a SHA-256 of the sorted configuration-critical component versions, and the
-- components themselves. One row per report; the latest report of a node is
-- argMax(fingerprint, (ts, ts_ms)).
CREATE TABLE IF NOT EXISTS conformance
(
    cluster String,
    node String,
    ts DateTime,
    ts_ms UInt16,
    -- id of the report (the HealthEvent id when it came as one)
    id String,
    fingerprint String,
    components Nested(name String, version String),
    received DateTime,
    stored DateTime DEFAULT now()
)
ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(received)
ORDER BY (cluster, node, ts, ts_ms, id);
