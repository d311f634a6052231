package clickhouse

// ColumnsOnEveryHost is columnsOnEveryHost, for the cluster tests.
var ColumnsOnEveryHost = columnsOnEveryHost

// SetupWaitWith is SetupWait with Setup replaced by setup.
var SetupWaitWith = setupWait
