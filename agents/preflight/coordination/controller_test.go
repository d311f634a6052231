package coordination

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestRunStoppedBeforeSync: a controller stopped while its pod cache has not
// synced yet (the API server slow or unreachable) stops cleanly, without an
// error: a shutdown is not a failure.
func TestRunStoppedBeforeSync(t *testing.T) {
	kc, err := kubernetes.NewForConfig(&rest.Config{Host: "http://127.0.0.1:1", Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c := New(kc, nil, slog.New(slog.DiscardHandler), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after a stop before the sync: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the stop")
	}
}
