-- Remediation outcomes: actions by role, kind and outcome, each action
-- counted once, with how many nodes and how many were dry runs.
-- param: since DateTime now-30d  actions at or after this time
-- param: until DateTime now      ...and before this time
-- param: cluster String ''       only this cluster ('' for all)
SELECT
    role,
    kind,
    outcome,
    uniqExact(id) AS actions,
    uniqExact(cluster, node) AS nodes,
    uniqExactIf(id, dry_run = 1) AS dry_runs
FROM actions
WHERE ts >= @since AND ts < @until AND (@cluster = '' OR cluster = @cluster)
GROUP BY role, kind, outcome
ORDER BY role, kind, outcome
