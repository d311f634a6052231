package fleet

import (
	"errors"
	"strings"
	"testing"
)

// TestParallelPanicIsAnError: a query function that panics is that
// request's error, not the end of the gateway (its goroutine is not the
// request's, which net/http recovers).
func TestParallelPanicIsAnError(t *testing.T) {
	other := errors.New("other")
	err := parallel(func() error { var m map[string]int; m["x"]++; return nil }, func() error { return other })
	if err == nil || !strings.Contains(err.Error(), "panic: assignment to entry in nil map") || !errors.Is(err, other) {
		t.Fatalf("err %v: want the panic and the other error", err)
	}
}
