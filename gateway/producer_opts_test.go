package gateway

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestProducerOpts: a raw producer built from ProducerOpts lingers and
// buffers as the gateway run with the same config does (the shipped 2 ms
// and 100,000 records, or a test's override), not a setting of its own.
func TestProducerOpts(t *testing.T) {
	tuned := DefaultConfig()
	tuned.ProducerLinger, tuned.MaxBufferedRecords = 5*time.Millisecond, 1<<20
	for name, cfg := range map[string]Config{"shipped": DefaultConfig(), "tuned": tuned} {
		cl, err := kgo.NewClient(ProducerOpts(cfg)...)
		if err != nil {
			t.Fatal(err)
		}
		if got := cl.OptValue(kgo.ProducerLinger); got != cfg.ProducerLinger {
			t.Errorf("%s: linger %v, the gateway's %v", name, got, cfg.ProducerLinger)
		}
		if got := cl.OptValue(kgo.MaxBufferedRecords); got != int64(cfg.MaxBufferedRecords) {
			t.Errorf("%s: buffer %v (%T), the gateway's %d", name, got, got, cfg.MaxBufferedRecords)
		}
		cl.Close()
	}
}
