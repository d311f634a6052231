package clickhouse

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// TestQuietHandler: the driver's logger as options builds it. Its error
// for a query the caller cancelled (what clickhouse-go logs when a role
// stops mid-query: `c.logger.Error("failed to get first block",
// slog.Any("error", err))` with the context's error) is lowered to DEBUG;
// other errors stay at ERROR; the old-server warning is dropped.
func TestQuietHandler(t *testing.T) {
	const first = "failed to get first block"
	for _, tc := range []struct {
		name  string
		level slog.Level // the role's log level
		at    slog.Level // the driver's record
		msg   string
		err   error
		want  string // the line ("" none)
	}{
		{"cancelled, info", slog.LevelInfo, slog.LevelError, first, context.Canceled, ""},
		{"cancelled, debug", slog.LevelDebug, slog.LevelError, first, context.Canceled,
			`level=DEBUG msg="failed to get first block" component=clickhouse error="context canceled"`},
		{"wrapped cancel", slog.LevelInfo, slog.LevelWarn, "read", fmt.Errorf("query processing: %w", context.Canceled), ""},
		{"deadline", slog.LevelInfo, slog.LevelError, first, context.DeadlineExceeded,
			`level=ERROR msg="failed to get first block" component=clickhouse error="context deadline exceeded"`},
		{"other error", slog.LevelInfo, slog.LevelError, first, errors.New("code: 47"),
			`level=ERROR msg="failed to get first block" component=clickhouse error="code: 47"`},
		{"old server", slog.LevelDebug, slog.LevelWarn, "unsupported clickhouse version", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tc.level, ReplaceAttr: noTime}))
			opts, err := DefaultConfig().options("d", log)
			if err != nil {
				t.Fatal(err)
			}
			opts.Logger.Log(context.Background(), tc.at, tc.msg, slog.Any("error", tc.err))
			got := strings.TrimSpace(buf.String())
			if got != tc.want {
				t.Fatalf("logged %q, want %q", got, tc.want)
			}
		})
	}
}

func noTime(_ []string, a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}
