package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/faultline/faultline/agents/hostzone"
)

// hostZoneCmd is `faultline-agent host-zone --etc DIR --out DIR`: it copies
// the host's time zone (DIR/localtime, and the timezone file that names a
// copied one) from the host's /etc as mounted into out (hostzone.Copy).
// The chart runs it in an init container, not root, that alone mounts the
// host's /etc; the agent mounts out and reads its time_zone_file there. A
// zone that cannot be read is said here and stops nothing (the agent
// reads its logs' times as UTC, as it does with no zone); only an out
// that cannot be written fails.
func hostZoneCmd(_ context.Context, args []string, stdout, stderr io.Writer) error {
	flags := flag.NewFlagSet("faultline-agent host-zone", flag.ContinueOnError)
	flags.SetOutput(stderr)
	etc := flags.String("etc", "/host/etc", "the host's /etc as mounted")
	out := flags.String("out", "", "the directory to copy the zone into (the agent's time_zone_file is its localtime)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *out == "" || flags.NArg() > 0 {
		return errors.New("host-zone: --out is required, and takes no arguments")
	}
	loc, zoneErr, err := hostzone.Copy(*etc, *out)
	if err != nil {
		return fmt.Errorf("host-zone: %w", err)
	}
	if zoneErr != nil {
		_, err = fmt.Fprintf(stderr, "host-zone: %v: the agent reads log times printed without a zone as UTC\n", zoneErr)
		return err
	}
	_, err = fmt.Fprintf(stdout, "host time zone %s (from %s) copied to %s\n", loc, *etc, *out)
	return err
}
