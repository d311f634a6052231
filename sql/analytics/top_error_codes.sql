-- Top error codes (XID-*, SXID-*, ...) by events, with how many nodes
-- reported each and the first nodes (by name) that did. Derived events are
-- left out: they repeat the codes of their causes.
-- param: since DateTime now-7d  events generated at or after this time
-- param: until DateTime now     ...and before this time
-- param: cluster String ''      only this cluster ('' for all)
-- param: prefix String ''       only codes starting with this, e.g. XID- or SXID-
-- param: limit UInt64 20        at most this many codes
SELECT
    code,
    uniqExact(id) AS events,
    uniqExact(cluster, node) AS nodes,
    arraySlice(arraySort(groupUniqArray(concat(cluster, '/', node))), 1, 10) AS first_nodes
FROM events
ARRAY JOIN error_codes AS code
WHERE ts >= @since AND ts < @until AND (@cluster = '' OR cluster = @cluster)
    AND derived_by = ''
    AND substring(code, 1, length(@prefix)) = @prefix
GROUP BY code
ORDER BY events DESC, code
LIMIT @limit
