package fabric

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/faultline/faultline/internal/fuzzseed"
)

// FuzzEvaluateEventsValid: whatever a recorded output of any kind holds,
// reading it (AddInput, the fabric check's own parsers) and evaluating
// the node does not panic, and every event, stamped with the agent's node
// name, passes the gateway's validation — one it refused would be dropped
// from the agent's spool.
func FuzzEvaluateEventsValid(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "*", "*"))
	for _, p := range files {
		if strings.Contains(p, ".golden.") || strings.HasSuffix(p, "README.md") || strings.HasPrefix(p, filepath.Join("testdata", "fuzz")) {
			continue
		}
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		k := DetectKind(string(b))
		for i, kind := range Kinds {
			if kind == k {
				f.Add(uint8(i), string(b))
			}
		}
	}
	cat, err := DefaultCatalog() // parsed once
	if err != nil {
		f.Fatal(err)
	}
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) // after every recording
	f.Fuzz(func(t *testing.T, kind uint8, text string) {
		s := NewSnapshot(time.Time{})
		if err := AddInput(s, Kinds[int(kind)%len(Kinds)], text, &LogReader{Loc: time.UTC, Year: 2024}); err != nil {
			if err.Error() == "" {
				t.Fatal("an error with no message")
			}
			return
		}
		s.Now = now
		e, err := NewEvaluator(EvalConfig{Platform: "auto", InProgressTimeout: 5 * time.Minute, Catalog: cat})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range e.Evaluate(s) {
			if ev.NodeName == "" {
				ev.NodeName = "gpu-node-1"
			}
			if err := fuzzseed.Gateway.Validate(ev, now); err != nil {
				t.Fatalf("event the gateway would refuse (%v): %v", err, ev)
			}
		}
	})
}
