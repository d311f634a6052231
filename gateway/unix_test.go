package gateway

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestListenUnix: the socket is 0660 whatever the umask, a stale socket is
// replaced, a file that is not a socket is never removed, and a path too
// long for the private directory still works.
func TestListenUnix(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	for range 2 { // the second time over the first's stale socket
		stale, err := net.Listen("unix", sock)
		if err == nil {
			stale.(*net.UnixListener).SetUnlinkOnClose(false)
			stale.Close()
		}
		ln, err := listenUnix(sock, "")
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(sock)
		if err != nil || st.Mode().Perm() != 0o660 || st.Mode().Type() != os.ModeSocket {
			t.Fatalf("socket %v, %v", st.Mode(), err)
		}
		ln.Close()
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			t.Fatalf("socket left behind after Close: %v", err)
		}
	}
	file := filepath.Join(dir, "data")
	if err := os.WriteFile(file, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := listenUnix(file, ""); err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Fatalf("over a regular file: %v", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Fatal("a regular file at the socket's path was removed")
	}
	long := filepath.Join(dir, strings.Repeat("d", 100-len(dir)))
	if err := os.Mkdir(long, 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := listenUnix(filepath.Join(long, "s"), "")
	if err != nil {
		t.Fatalf("a path with no room for the private directory: %v", err)
	}
	ln.Close()
	if _, err := listenUnix(sock, "no-such-group-here"); err == nil || !strings.Contains(err.Error(), "gateway.unix_socket_group") {
		t.Fatalf("unknown group: %v", err)
	}
}
