package testenv

import (
	"fmt"
	"testing"
)

// ClickHouseTLS is a ClickHouse server that also serves the native
// protocol over TLS (tcp_port_secure), with a certificate for 127.0.0.1
// and localhost issued by CA.
type ClickHouseTLS struct {
	*ClickHouse
	// SecureAddr is the TLS native-protocol address, host:port.
	SecureAddr string
	// CA signed the server's certificate (CA.File is its PEM).
	CA *CA
}

// StartClickHouseTLS starts a ClickHouse server like StartClickHouse, plus
// its secure native port. It is stopped when the test ends.
func StartClickHouseTLS(tb testing.TB) *ClickHouseTLS {
	tb.Helper()
	Server(tb, "a ClickHouse server (TLS)", nil) // -short
	ps := freePorts(tb, 3)
	ca := NewCA(tb, "", "clickhouse-ca")
	kp := ca.Issue(tb, "clickhouse", "127.0.0.1", "localhost")
	xml := fmt.Sprintf(`<?xml version="1.0"?>
<yandex>
  <tcp_port_secure>%d</tcp_port_secure>
  <openSSL>
    <server>
      <certificateFile>%s</certificateFile>
      <privateKeyFile>%s</privateKeyFile>
      <verificationMode>none</verificationMode>
      <loadDefaultCAFile>false</loadDefaultCAFile>
      <cacheSessions>true</cacheSessions>
      <disableProtocols>sslv2,sslv3,tlsv1,tlsv1_1</disableProtocols>
      <preferServerCiphers>true</preferServerCiphers>
    </server>
  </openSSL>
</yandex>
`, ps[2], kp.CertFile, kp.KeyFile)
	c := startClickHouse(tb, "clickhouse-tls", ps[0], ps[1], map[string]string{"tls.xml": xml})
	return &ClickHouseTLS{ClickHouse: c, SecureAddr: fmt.Sprintf("127.0.0.1:%d", ps[2]), CA: ca}
}
