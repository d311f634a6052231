package clickhouse

// ColumnsOnEveryHost is columnsOnEveryHost, for the cluster tests.
var ColumnsOnEveryHost = columnsOnEveryHost
