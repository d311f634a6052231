package gateway

import (
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
)

// listenUnix creates the node-local socket with mode 0660, owned by the
// gateway's user and group (or the given group, a name or a numeric id).
// The socket is created in a private directory (mode 0700) beside path,
// given its mode and group there, and only then renamed into place, so no
// client can connect while it is open to more than the owner and group.
func listenUnix(path, group string) (net.Listener, error) {
	gid := -1
	if group != "" {
		id, err := lookupGroup(group)
		if err != nil {
			return nil, fmt.Errorf("gateway.unix_socket_group: %w", err)
		}
		gid = id
	}
	if st, err := os.Lstat(path); err == nil && st.Mode().Type() != os.ModeSocket {
		return nil, fmt.Errorf("gateway.unix_socket: %s exists and is not a socket", path)
	}
	private, err := os.MkdirTemp(filepath.Dir(path), ".fl")
	if err != nil {
		return nil, fmt.Errorf("gateway.unix_socket: %w", err)
	}
	defer os.RemoveAll(private)
	tmp := filepath.Join(private, "s")
	if len(tmp) >= maxSocketPath {
		// The private path is too long for a socket address: create the
		// socket in place, where it has the umask's permissions for the
		// moment until its own are set (the rename is then a no-op).
		tmp = path
		_ = os.Remove(path) // a socket left by an earlier run
	}
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("gateway.unix_socket: %w", err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false) // the socket is renamed; unixListener removes it
	fail := func(err error) (net.Listener, error) {
		ul.Close()
		return nil, err
	}
	if err := os.Chmod(tmp, 0o660); err != nil {
		return fail(fmt.Errorf("gateway.unix_socket: %w", err))
	}
	if gid >= 0 {
		if err := os.Chown(tmp, -1, gid); err != nil {
			return fail(fmt.Errorf("gateway.unix_socket_group: %w", err))
		}
	}
	if tmp != path {
		_ = os.Remove(path) // a socket left by an earlier run
		if err := os.Rename(tmp, path); err != nil {
			return fail(fmt.Errorf("gateway.unix_socket: %w", err))
		}
	}
	return &unixListener{UnixListener: ul, path: path}, nil
}

// maxSocketPath is the room for a unix socket's path (sun_path is 108
// bytes on Linux, with its terminating NUL).
const maxSocketPath = 107

func lookupGroup(group string) (int, error) {
	if id, err := strconv.Atoi(group); err == nil {
		return id, nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(g.Gid)
}

// unixListener removes its socket when closed.
type unixListener struct {
	*net.UnixListener
	path string
}

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	_ = os.Remove(l.path)
	return err
}
