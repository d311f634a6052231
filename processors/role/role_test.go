package role

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestRunFailsWithALoop: a side loop that fails, stops early or panics
// fails the role, naming the role and the loop, stops the other loops, and
// the role is closed; a role whose loops run until ctx ends returns nil.
func TestRunFailsWithALoop(t *testing.T) {
	wait := func(ctx context.Context) error { <-ctx.Done(); return nil }
	for _, tc := range []struct {
		name string
		loop func(ctx context.Context) error
		want string // "" for nil
	}{
		{"error", func(context.Context) error { return errors.New("producer gone") }, "role r: broken: producer gone"},
		{"stopped early", func(context.Context) error { return nil }, "role r: broken: stopped before the role did"},
		{"panic", func(context.Context) error { panic("nil map") }, "role r: broken: panic: nil map"},
		{"runs until the end", wait, ""},
		{"returns ctx's error at the end", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var closed, otherStopped atomic.Bool
			r := &Role{
				Name: "r",
				Loops: []Loop{
					{Name: "other", Run: func(ctx context.Context) error { <-ctx.Done(); otherStopped.Store(true); return nil }},
					{Name: "broken", Run: tc.loop},
				},
				Close: func() error { closed.Store(true); return nil },
			}
			// A loop that fails must end Run itself: long before this.
			end := 30 * time.Second
			if tc.want == "" {
				end = 200 * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(context.Background(), end)
			defer cancel()
			err := r.Run(ctx, Deps{})
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Run: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Run: %v, want %q", err, tc.want)
			}
			if tc.want != "" && ctx.Err() != nil {
				t.Fatal("the failure did not end Run before ctx did")
			}
			if !closed.Load() || !otherStopped.Load() {
				t.Fatalf("closed %v, other loop stopped %v", closed.Load(), otherStopped.Load())
			}
		})
	}
}
