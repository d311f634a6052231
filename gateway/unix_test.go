package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestListenUnix: the gateway's socket (internal/unixsock, tested there)
// names the gateway's keys in its errors.
func TestListenUnix(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "data")
	if err := os.WriteFile(file, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := listenUnix(file, ""); err == nil || !strings.HasPrefix(err.Error(), "gateway.unix_socket: ") {
		t.Fatalf("over a regular file: %v", err)
	}
	if _, err := listenUnix(filepath.Join(dir, "s.sock"), "no-such-group-here"); err == nil || !strings.HasPrefix(err.Error(), "gateway.unix_socket_group: ") {
		t.Fatalf("unknown group: %v", err)
	}
}
