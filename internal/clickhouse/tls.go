package clickhouse

import "github.com/faultline/faultline/internal/tlsclient"

// TLSConfig is TLS to ClickHouse's secure native port (tcp_port_secure,
// usually 9440; ClickHouse Cloud requires it).
type TLSConfig = tlsclient.Config
