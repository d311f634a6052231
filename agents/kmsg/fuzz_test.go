package kmsg

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faultline/faultline/internal/fuzzseed"
)

// FuzzParserEventsValid: whatever a kernel log holds, the parser does not
// panic and every event it emits, stamped with the agent's node name as
// the agent does, passes the gateway's validation — one it would refuse
// would hold the agent's spool back.
func FuzzParserEventsValid(f *testing.F) {
	for _, name := range []string{"mixed.log", "negative.log"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
		for line := range strings.SplitSeq(string(b), "\n") {
			f.Add(line)
		}
	}
	cat, err := DefaultCatalog() // parsed once: 2 ms a parser otherwise
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, log string) {
		p := testParser(t, func(c *ParserConfig) { c.Catalog = cat })
		for line := range strings.SplitSeq(log, "\n") {
			p.Process(Line{Text: line, Mono: -1})
		}
		p.Flush(true)
		for _, ev := range p.Drain() {
			if ev.NodeName == "" {
				ev.NodeName = "gpu-node-1"
			}
			if err := fuzzseed.Gateway.Validate(ev, testNow); err != nil {
				t.Fatalf("event the gateway would refuse (%v): %v", err, ev)
			}
		}
	})
}
