package clusters

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestWatchErrorLogger(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		wantLevel string // "" = not logged
		wantMsg   string
	}{
		// client-go hands the handler failed lists and watch starts only:
		// an EOF there is a connection closed with no apiserver behind it.
		{"list closed", &url.Error{Op: "Get", URL: "https://lb/api/v1/nodes", Err: io.EOF}, "WARN", "watch of nodes failed; retrying"},
		{"stopped", fmt.Errorf("Get \"http://127.0.0.1/apis/x\": %w", context.Canceled), "", ""},
		{"expired resourceVersion", apierrors.NewResourceExpired("too old resource version: 1 (2)"), "INFO", "watch of nodes expired; listing them again"},
		{"410 Gone", apierrors.NewGone("gone"), "INFO", "watch of nodes expired; listing them again"},
		{"cut off", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), "INFO", "watch of nodes cut off; watching again"},
		{"forbidden", apierrors.NewForbidden(schema.GroupResource{Resource: "nodes"}, "", errors.New("RBAC")), "WARN", "watch of nodes failed; retrying"},
		{"refused", errors.New("dial tcp 127.0.0.1:6443: connect: connection refused"), "WARN", "watch of nodes failed; retrying"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			WatchErrorLogger(slog.New(slog.NewJSONHandler(&buf, nil)).With("cluster", "alpha"), "nodes")(nil, tt.err)
			if tt.wantLevel == "" {
				if buf.Len() != 0 {
					t.Fatalf("logged %s, want nothing", buf.String())
				}
				return
			}
			var rec map[string]any
			if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
				t.Fatalf("log line %q: %v", buf.String(), err)
			}
			if rec["level"] != tt.wantLevel || rec["msg"] != tt.wantMsg || rec["cluster"] != "alpha" || rec["err"] != tt.err.Error() {
				t.Fatalf("logged %v, want level %s, msg %q, cluster alpha, err %q", rec, tt.wantLevel, tt.wantMsg, tt.err)
			}
		})
	}
}
