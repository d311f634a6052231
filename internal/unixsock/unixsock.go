// Package unixsock creates the node-local unix sockets that faultline
// serves NVSentinel's monitors on (the gateway's gateway.unix_socket, the
// agent's nvsentinel_socket): mode 0660 with a configured group, never
// open to more than owner and group, never replacing a file that is not a
// socket.
package unixsock

import (
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
)

// Keys name the configuration keys of a socket's path and group; errors
// start with the key they concern.
type Keys struct {
	Path, Group string
}

// Listen creates the socket at path with mode 0660, owned by the process's
// user and group (or group, a name or a numeric id). The socket is created
// in a private directory (mode 0700) beside path, given its mode and group
// there, and only then renamed into place, so no client can connect while
// it is open to more than the owner and group. A socket left at path by an
// earlier run is replaced; any other file there is an error, and is left
// alone. Closing the listener removes the socket, unless another Listen
// has replaced it since (a new server started before the old one stopped:
// its socket is left to it).
func Listen(path, group string, keys Keys) (net.Listener, error) {
	return listen(path, group, keys, false)
}

// ListenKept is Listen, but closing the listener leaves the socket file in
// place (refusing connections until the next Listen replaces it): a
// client then tells a server that is restarting (connection refused) from
// a node where none ever ran (no such file).
func ListenKept(path, group string, keys Keys) (net.Listener, error) {
	return listen(path, group, keys, true)
}

func listen(path, group string, keys Keys, keep bool) (net.Listener, error) {
	gid := -1
	if group != "" {
		id, err := LookupGroup(group)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", keys.Group, err)
		}
		gid = id
	}
	if st, err := os.Lstat(path); err == nil && st.Mode().Type() != os.ModeSocket {
		return nil, fmt.Errorf("%s: %s exists and is not a socket", keys.Path, path)
	}
	private, err := os.MkdirTemp(filepath.Dir(path), ".fl")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keys.Path, err)
	}
	defer os.RemoveAll(private)
	tmp := filepath.Join(private, "s")
	if len(tmp) >= MaxPath {
		// The private path is too long for a socket address: create the
		// socket in place, where it has the umask's permissions for the
		// moment until its own are set (the rename is then a no-op).
		tmp = path
		_ = os.Remove(path) // a socket left by an earlier run
	}
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keys.Path, err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false) // the socket is renamed; listener removes it
	fail := func(err error) (net.Listener, error) {
		ul.Close()
		return nil, err
	}
	if err := os.Chmod(tmp, 0o660); err != nil {
		return fail(fmt.Errorf("%s: %w", keys.Path, err))
	}
	if gid >= 0 {
		if err := os.Chown(tmp, -1, gid); err != nil {
			return fail(fmt.Errorf("%s: %w", keys.Group, err))
		}
	}
	// The socket's identity, kept by the rename: Close removes only this
	// file, never one a later Listen put at path.
	id, err := os.Lstat(tmp)
	if err != nil {
		return fail(fmt.Errorf("%s: %w", keys.Path, err))
	}
	if tmp != path {
		_ = os.Remove(path) // a socket left by an earlier run
		if err := os.Rename(tmp, path); err != nil {
			return fail(fmt.Errorf("%s: %w", keys.Path, err))
		}
	}
	return &listener{UnixListener: ul, path: path, id: id, keep: keep}, nil
}

// MaxPath is the room for a unix socket's path (sun_path is 108 bytes on
// Linux, with its terminating NUL).
const MaxPath = 107

// LookupGroup returns the id of a group given by name or numeric id (not
// negative: Listen takes a negative id for none, and the socket would keep
// the process's group).
func LookupGroup(group string) (int, error) {
	if id, err := strconv.Atoi(group); err == nil {
		if id < 0 {
			return 0, fmt.Errorf("group id %d is negative", id)
		}
		return id, nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(g.Gid)
}

// listener removes its socket when closed, unless keep or the file at
// path is no longer its socket (id).
type listener struct {
	*net.UnixListener
	path string
	id   os.FileInfo
	keep bool
}

func (l *listener) Close() error {
	// Compared while the socket is still open, so its inode cannot have
	// been reused by the file now at path.
	cur, serr := os.Lstat(l.path)
	err := l.UnixListener.Close()
	if !l.keep && serr == nil && os.SameFile(cur, l.id) {
		_ = os.Remove(l.path)
	}
	return err
}
