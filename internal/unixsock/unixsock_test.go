package unixsock

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

var keys = Keys{Path: "x.socket", Group: "x.socket_group"}

// TestListen: the socket is 0660 whatever the umask, a stale socket is
// replaced, a file that is not a socket is never removed, and a path too
// long for the private directory still works.
func TestListen(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	for range 2 { // the second time over the first's stale socket
		stale, err := net.Listen("unix", sock)
		if err == nil {
			stale.(*net.UnixListener).SetUnlinkOnClose(false)
			stale.Close()
		}
		ln, err := Listen(sock, "", keys)
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
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Fatalf("private directories left behind: %v", ents)
	}
	file := filepath.Join(dir, "data")
	if err := os.WriteFile(file, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(file, "", keys); err == nil || err.Error() != "x.socket: "+file+" exists and is not a socket" {
		t.Fatalf("over a regular file: %v", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "keep" {
		t.Fatal("a regular file at the socket's path was removed")
	}
	if err := os.Symlink(file, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(filepath.Join(dir, "link"), "", keys); err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Fatalf("over a symbolic link: %v", err)
	}
	long := filepath.Join(dir, strings.Repeat("d", 100-len(dir)))
	if err := os.Mkdir(long, 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := Listen(filepath.Join(long, "s"), "", keys)
	if err != nil {
		t.Fatalf("a path with no room for the private directory: %v", err)
	}
	if st, err := os.Stat(filepath.Join(long, "s")); err != nil || st.Mode().Perm() != 0o660 {
		t.Fatalf("in place: %v %v", st.Mode(), err)
	}
	ln.Close()
	if _, err := Listen(sock, "no-such-group-here", keys); err == nil || !strings.HasPrefix(err.Error(), "x.socket_group: ") {
		t.Fatalf("unknown group: %v", err)
	}
}

// TestListenGroup: the socket belongs to the configured group, by name or
// by id.
func TestListenGroup(t *testing.T) {
	gid := os.Getgid()
	if gs, _ := os.Getgroups(); os.Geteuid() != 0 && len(gs) > 0 {
		gid = gs[len(gs)-1] // a group this user is in
	} else if os.Geteuid() == 0 {
		gid = 1 // root may give any group
	}
	for _, group := range []string{strconv.Itoa(gid), groupName(t, gid)} {
		if group == "" {
			continue
		}
		sock := filepath.Join(t.TempDir(), "g.sock")
		ln, err := Listen(sock, group, keys)
		if err != nil {
			t.Fatalf("group %q: %v", group, err)
		}
		st, err := os.Stat(sock)
		if err != nil {
			t.Fatal(err)
		}
		if got := int(st.Sys().(*syscall.Stat_t).Gid); got != gid || st.Mode().Perm() != 0o660 {
			t.Fatalf("group %q: socket gid %d mode %v, want %d 0660", group, got, st.Mode().Perm(), gid)
		}
		ln.Close()
	}
}

func groupName(t *testing.T, gid int) string {
	t.Helper()
	b, err := os.ReadFile("/etc/group")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 3 && f[2] == strconv.Itoa(gid) {
			return f[0]
		}
	}
	return ""
}

// TestLookupGroupNegative: a negative group id was taken (Listen then
// skipped the chown, leaving the process's group on the socket).
func TestLookupGroupNegative(t *testing.T) {
	if _, err := LookupGroup("-5"); err == nil {
		t.Error("group -5 accepted")
	}
	if id, err := LookupGroup("65532"); err != nil || id != 65532 {
		t.Errorf("group 65532: %d, %v", id, err)
	}
}

// TestListenOverlap: when a new server listens on the path while the old
// one still runs (a rolling update with surge), the old one's Close leaves
// the new one's socket in place; the new one's Close still removes it.
func TestListenOverlap(t *testing.T) {
	for _, long := range []bool{false, true} {
		dir := t.TempDir()
		if long { // no room for the private directory: created in place
			dir = filepath.Join(dir, strings.Repeat("d", 100-len(dir)))
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		sock := filepath.Join(dir, "s")
		a, err := Listen(sock, "", keys)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Listen(sock, "", keys)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				c, err := b.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		a.Close()
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatalf("long %v: the new socket after the old listener closed: %v", long, err)
		}
		c.Close()
		b.Close()
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			t.Fatalf("long %v: socket left behind after the new listener's Close: %v", long, err)
		}
	}
}
