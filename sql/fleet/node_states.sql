-- Fleet page: every node of a cluster that the actions history says is not
-- plainly healthy, with its state derived from the latest actions (only
-- max and argMax over them: a row the store wrote twice changes nothing, so
-- no deduplication is needed; the first quarantine after the last release
-- is the least of a set, which a duplicate does not change either):
-- quarantined (a quarantine applied, or decided in dry-run, after the last
-- release; since the first of them), draining (the drain of that quarantine
-- in progress or blocked), remediating (its remediation created or in
-- progress), escalated (escalated to support), held (a quarantine held back
-- by the circuit breaker and nothing applied since). A release is an
-- unquarantine applied (no fault left) or a person's uncordon. Times are
-- Unix milliseconds.
--
-- Held and dry-run quarantines applied nothing, so no unquarantine ever
-- releases them: such a state ends once every fault (check and entities)
-- they decided on since the last release has recovered, its latest event
-- in events (by generated time) healthy. A fault with no stored event
-- stands.
-- param: cluster String ''   the cluster
-- param: now DateTime now    the state as of this time
-- param: node String ''      only this node ('' for all)
SELECT
    node,
    multiIf(
        quarantined = 1 AND e_at >= q_at, 'escalated',
        quarantined = 1 AND m_at >= q_at AND m_outcome IN ('applied', 'in_progress'), 'remediating',
        quarantined = 1 AND d_at >= q_at AND d_outcome IN ('in_progress', 'blocked'), 'draining',
        quarantined = 1, 'quarantined',
        'held') AS state,
    toUInt64(multiIf(
        quarantined = 1 AND e_at >= q_at, e_at,
        quarantined = 1 AND m_at >= q_at AND m_outcome IN ('applied', 'in_progress'), m_at,
        quarantined = 1 AND d_at >= q_at AND d_outcome IN ('in_progress', 'blocked'), d_at,
        quarantined = 1, q_at,
        held_at)) AS state_since_ms,
    toUInt64(if(quarantined = 1, q_at, held_at)) AS quarantined_since_ms,
    if(quarantined = 1, q_check, h_check) AS check,
    if(quarantined = 1, q_rule, h_rule) AS rule,
    if(quarantined = 1, q_reason, h_reason) AS reason,
    toUInt8(quarantined = 1 AND q_dry = 1) AS dry_run,
    m_outcome AS remediation,
    d_outcome AS drain,
    toUInt64(last_at) AS last_action_ms
FROM
(
    SELECT
        node,
        -- the faults of the quarantines decided since the last release
        -- but not applied: held by the breaker, or dry-run
        arrayMap(x -> x.2, arrayFilter(x -> x.1 > r_at,
            groupArrayIf((t, concat(check, '\n', entities)), kind = 'quarantine' AND outcome IN ('held_by_breaker', 'dry_run')))) AS unapplied,
        maxIf(t, kind = 'quarantine' AND outcome IN ('applied', 'dry_run')) AS q_last,
        maxIf(t, (kind = 'unquarantine' AND outcome = 'applied') OR kind = 'manual_uncordon') AS r_at,
        -- the first quarantine after the last release: the quarantine role
        -- writes another applied action for every repeat of a standing
        -- fault, and a repeat starts no new drain or remediation, so the
        -- states since are measured from the first
        arrayReduce('min', arrayFilter(x -> x > r_at,
            groupArrayIf(t, kind = 'quarantine' AND outcome IN ('applied', 'dry_run')))) AS q_at,
        maxIf(t, kind = 'quarantine' AND outcome = 'held_by_breaker') AS held_at,
        toUInt8(q_last > r_at) AS quarantined,
        toUInt8(q_last <= r_at AND held_at > r_at AND held_at > q_last) AS held,
        argMaxIf(check, t, kind = 'quarantine' AND outcome IN ('applied', 'dry_run')) AS q_check,
        argMaxIf(rule, t, kind = 'quarantine' AND outcome IN ('applied', 'dry_run')) AS q_rule,
        argMaxIf(reason, t, kind = 'quarantine' AND outcome IN ('applied', 'dry_run')) AS q_reason,
        argMaxIf(dry_run, t, kind = 'quarantine' AND outcome IN ('applied', 'dry_run')) AS q_dry,
        argMaxIf(check, t, kind = 'quarantine' AND outcome = 'held_by_breaker') AS h_check,
        argMaxIf(rule, t, kind = 'quarantine' AND outcome = 'held_by_breaker') AS h_rule,
        argMaxIf(reason, t, kind = 'quarantine' AND outcome = 'held_by_breaker') AS h_reason,
        maxIf(t, drain_step) AS d_at,
        argMaxIf(outcome, t, drain_step) AS d_outcome,
        maxIf(t, kind = 'remediate') AS m_at,
        argMaxIf(outcome, t, kind = 'remediate') AS m_outcome,
        maxIf(t, kind = 'escalate') AS e_at,
        max(t) AS last_at
    FROM
    (
        SELECT node, id, role, kind, outcome, reason, rule, check, dry_run, toUInt64(ts) * 1000 + ts_ms AS t,
            details.value[indexOf(details.key, 'entities')] AS entities,
            -- a fault the finished drain covered (drain.ReasonCovered) is
            -- not a step of the node's drain
            role = 'drain' AND NOT (outcome = 'skipped' AND reason LIKE 'fault covered by the finished drain %') AS drain_step
        FROM actions
        WHERE cluster = @cluster AND ts <= @now AND (@node = '' OR node = @node)
    )
    GROUP BY node
    HAVING quarantined = 1 OR held = 1
) AS a
ANY LEFT JOIN
(
    -- the held and dry-run faults whose latest event is healthy
    SELECT node, groupArrayIf(fault, healthy = 1) AS recovered
    FROM
    (
        SELECT node, concat(check, '\n', entity) AS fault, argMax(is_healthy, toUInt64(ts) * 1000 + ts_ms) AS healthy
        FROM events
        WHERE cluster = @cluster AND ts <= @now AND (@node = '' OR node = @node)
            AND (node, check, entity) GLOBAL IN (
                SELECT node, check, details.value[indexOf(details.key, 'entities')]
                FROM actions
                WHERE cluster = @cluster AND ts <= @now AND (@node = '' OR node = @node)
                    AND kind = 'quarantine' AND outcome IN ('held_by_breaker', 'dry_run'))
        GROUP BY node, check, entity
    )
    GROUP BY node
) AS r USING node
WHERE NOT ((held = 1 OR q_dry = 1) AND notEmpty(unapplied) AND hasAll(recovered, unapplied))
