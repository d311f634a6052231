-- a table; a ';' inside a comment does not split
CREATE TABLE IF NOT EXISTS t1 (a UInt8, s String DEFAULT 'x;y') ENGINE = MergeTree() ORDER BY a;
CREATE TABLE IF NOT EXISTS t2 (a UInt8) ENGINE = MergeTree() ORDER BY a;
