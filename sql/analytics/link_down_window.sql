-- Window query of the correlation rules (RepeatedNICLinkFlap): distinct
-- link-down (unhealthy) events of one check on one NIC port of one node in
-- the window seconds up to until. Reads one index range of the events table.
-- param: cluster String ''   the cluster
-- param: node String ''      the node
-- param: check String ''     the check name (e.g. the NIC state check)
-- param: entity String ''    the port's entity key, e.g. NIC=mlx5_0,NICPort=1
-- param: until DateTime now  end of the window (inclusive)
-- param: window UInt64 600   window length in seconds
SELECT uniqExact(id) AS link_downs
FROM events
WHERE cluster = @cluster AND node = @node AND check = @check AND entity = @entity
    AND ts > @until - @window AND ts <= @until
    AND is_healthy = 0
