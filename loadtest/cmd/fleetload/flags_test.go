package main

import (
	"testing"

	"github.com/faultline/faultline/loadtest/fleet"
)

// TestParseTransport: grpc, rest or the scenario's default; anything
// else, which the load would have sent through REST, is refused.
func TestParseTransport(t *testing.T) {
	for _, c := range []struct {
		in    string
		want  fleet.Transport
		fails bool
	}{
		{"", "", false},
		{"grpc", fleet.GRPC, false},
		{"rest", fleet.REST, false},
		{"gRPC", "", true},
		{"http", "", true},
		{"grcp", "", true},
	} {
		got, err := parseTransport(c.in)
		if (err != nil) != c.fails || got != c.want {
			t.Errorf("parseTransport(%q) = %q, %v; want %q, fails %v", c.in, got, err, c.want, c.fails)
		}
	}
}

// TestParseNodeEvents: empty is the shipped setting (nil); true and false
// as strconv.ParseBool reads them; anything else is refused, not false.
func TestParseNodeEvents(t *testing.T) {
	yes, no := true, false
	for _, c := range []struct {
		in    string
		want  *bool
		fails bool
	}{
		{"", nil, false},
		{"true", &yes, false},
		{"True", &yes, false},
		{"1", &yes, false},
		{"false", &no, false},
		{"0", &no, false},
		{"yes", nil, true},
		{"on", nil, true},
	} {
		got, err := parseNodeEvents(c.in)
		if (err != nil) != c.fails || (got == nil) != (c.want == nil) || (got != nil && *got != *c.want) {
			t.Errorf("parseNodeEvents(%q) = %v, %v; want %v, fails %v", c.in, show(got), err, show(c.want), c.fails)
		}
	}
}

func show(b *bool) any {
	if b == nil {
		return nil
	}
	return *b
}
