package kmsg

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/faultline/faultline/agents/hostzone"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// ParseCommand is "faultline-agent kmsg parse [flags] [FILE]": it reads a
// kernel log (FILE, or stdin without one) in any supported format and
// prints, as JSON lines, the events the kmsg check would report — one line
// per event, a flood being one line whose metadata.count says how many
// occurrences it stands for.
func ParseCommand(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("kmsg parse", flag.ContinueOnError)
	fs.SetOutput(stdout)
	year := fs.Int("year", 0, "year of syslog timestamps, which print none (default: this year, or last year for a date more than a day ahead)")
	utc := fs.Bool("utc", false, "read timestamps printed without a zone as UTC (default: local time)")
	zone := fs.String("time-zone", "", "zone of timestamps printed without one, the recording host's: a zone name (America/Chicago) or host (this machine's /etc/localtime) (default: local time)")
	boot := fs.String("boot-time", "", "boot time (RFC 3339) to turn kernel timestamps into wall-clock times")
	window := fs.Duration("flood-window", 10*time.Second, "flood-control window per error and device")
	burst := fs.Int("flood-burst", 1, "occurrences per window reported one by one")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 1 {
		return fmt.Errorf("kmsg parse: at most one FILE, got %d", fs.NArg())
	}
	cfg := ParserConfig{Year: *year, FloodWindow: *window, FloodBurst: *burst}
	if *utc {
		cfg.Location = time.UTC
	}
	if *zone != "" {
		loc, err := hostzone.Location(*zone, "")
		if err != nil {
			return fmt.Errorf("kmsg parse: --time-zone: %w", err)
		}
		cfg.Location = loc
	}
	if *boot != "" {
		t, err := time.Parse(time.RFC3339Nano, *boot)
		if err != nil {
			return fmt.Errorf("kmsg parse: --boot-time: %w", err)
		}
		cfg.BootTime = t
	}
	in := stdin
	if fs.NArg() == 1 {
		f, err := os.Open(fs.Arg(0))
		if err != nil {
			return fmt.Errorf("kmsg parse: %w", err)
		}
		defer f.Close()
		in = f
	}
	p, err := NewParser(cfg)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	if err := ParseStream(p, in, func(ev *datamodels.HealthEvent) error {
		b, err := MarshalEvent(ev)
		if err != nil {
			return err
		}
		w.Write(b)
		return w.WriteByte('\n')
	}); err != nil {
		return fmt.Errorf("kmsg parse: %w", err)
	}
	return w.Flush()
}

// ParseStream feeds every line of r to p and passes the events, in log
// order, to fn; at the end of r every open flood window is closed.
func ParseStream(p *Parser, r io.Reader, fn func(*datamodels.HealthEvent) error) error {
	br := bufio.NewReaderSize(r, 256*1024)
	n := 0
	for {
		line, err := br.ReadString('\n')
		if len(line) > 0 {
			if line[len(line)-1] == '\n' {
				line = line[:len(line)-1]
			}
			p.Process(Line{Text: line, Mono: -1})
			n++
			if n%4096 == 0 {
				for _, ev := range p.Drain() {
					if err := fn(ev); err != nil {
						return err
					}
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	p.Flush(true)
	for _, ev := range p.Drain() {
		if err := fn(ev); err != nil {
			return err
		}
	}
	return nil
}

// MarshalEvent encodes an event as compact JSON with the REST field names
// (camelCase, enums by name, RFC 3339 times) and sorted keys, so that the
// same event always prints the same bytes.
func MarshalEvent(ev *datamodels.HealthEvent) ([]byte, error) {
	b, err := protojson.MarshalOptions{EmitDefaultValues: true}.Marshal(ev)
	if err != nil {
		return nil, err
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}
