package gateway

import (
	"net"

	"github.com/faultline/faultline/internal/unixsock"
)

// listenUnix creates the node-local socket: mode 0660, owned by the
// gateway's user and group (or the given group), never replacing a file
// that is not a socket (see unixsock.Listen).
func listenUnix(path, group string) (net.Listener, error) {
	return unixsock.Listen(path, group, unixsock.Keys{Path: "gateway.unix_socket", Group: "gateway.unix_socket_group"})
}
