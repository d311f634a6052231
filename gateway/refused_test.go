package gateway

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/faultline/faultline/internal/warnlimit"
)

// TestRefusedBusyNamesEachCredential: several credentials refused at once
// are each named once (stop 56 named one per 10 s for the whole gateway),
// a credential refused again is not named twice, and past warnKeys one line
// says the rest are not named; every refusal is counted.
func TestRefusedBusyNamesEachCredential(t *testing.T) {
	var buf bytes.Buffer
	reg := prometheus.NewRegistry()
	s := &Server{log: slog.New(slog.NewTextHandler(&buf, nil)), metrics: newMetrics(reg), busyWarns: warnlimit.New(warnWindow, warnKeys)}
	busy := fmt.Errorf("reading: %w", errCallerBusy)
	refusals := 0
	for round := 0; round < 3; round++ {
		for i := 0; i < warnKeys+4; i++ {
			msg := s.refusedBusy(busy, Caller{Name: fmt.Sprintf("token:c%d#1", i), Cluster: fmt.Sprintf("c%d", i)})
			if !strings.Contains(msg, "max_read_bytes_per_caller") {
				t.Fatalf("answer %q does not name the key", msg)
			}
			refusals++
		}
	}
	// Another reason is counted, never logged as a busy credential.
	s.refusedBusy(errBusy, Caller{Name: "token:other#1"})

	log := buf.String()
	for i := 0; i < warnKeys+4; i++ {
		want := fmt.Sprintf("caller=token:c%d#1 cluster=c%d\n", i, i)
		if n, wantN := strings.Count(log, want), map[bool]int{true: 1, false: 0}[i < warnKeys]; n != wantN {
			t.Errorf("%q logged %d times, want %d; log:\n%s", want, n, wantN, log)
		}
	}
	if n := strings.Count(log, fmt.Sprintf("more than %d credentials refused within 10s", warnKeys)); n != 1 {
		t.Errorf("the rest-not-named line logged %d times, want 1; log:\n%s", n, log)
	}
	if n := strings.Count(log, "\n"); n != warnKeys+1 {
		t.Errorf("%d lines logged, want %d", n, warnKeys+1)
	}
	if strings.Contains(log, "token:other#1") {
		t.Errorf("a refusal of the whole budget named its caller as a busy credential:\n%s", log)
	}
	want := fmt.Sprintf(`faultline_gateway_events_rejected_total{reason="caller_busy"} %d`, refusals)
	if got := metricText(t, reg, "faultline_gateway_events_rejected_total"); !strings.Contains(got, want+"\n") {
		t.Errorf("want %s; got:\n%s", want, got)
	}
}

// TestConnRefusedNamesEachAddress: each address a door refuses is named
// once a window (each door its own), the total cap once a door, and past
// warnKeys one line says the rest are not named; every refusal counted.
func TestConnRefusedNamesEachAddress(t *testing.T) {
	var buf bytes.Buffer
	reg := prometheus.NewRegistry()
	s := &Server{log: slog.New(slog.NewTextHandler(&buf, nil)), metrics: newMetrics(reg), connWarns: warnlimit.New(warnWindow, warnKeys)}
	grpcRefused, restRefused := s.connRefused(doorGRPC), s.connRefused(doorREST)
	for i := 0; i < 3; i++ {
		grpcRefused("10.0.0.1", false)
		grpcRefused("10.0.0.2", false)
		restRefused("10.0.0.1", false)
		grpcRefused("10.0.0.3", true)
		restRefused("10.0.0.4", true)
	}
	for i := 0; i < warnKeys; i++ {
		grpcRefused(fmt.Sprintf("10.1.0.%d", i), false)
	}
	log := buf.String()
	for _, want := range []string{
		"door=grpc client=10.0.0.1 ", "door=grpc client=10.0.0.2 ", "door=rest client=10.0.0.1 ",
		"gateway.max_conns reached\" door=grpc", "gateway.max_conns reached\" door=rest",
		fmt.Sprintf("more than %d addresses refused within 10s", warnKeys),
	} {
		if n := strings.Count(log, want); n != 1 {
			t.Errorf("%q logged %d times, want 1; log:\n%s", want, n, log)
		}
	}
	if n := strings.Count(log, "\n"); n != warnKeys+1 {
		t.Errorf("%d lines logged, want %d (each address once, then one line):\n%s", n, warnKeys+1, log)
	}
	if got, want := metricText(t, reg, "faultline_gateway_connections_refused_total"), fmt.Sprintf("{door=\"grpc\"} %d\n", 9+warnKeys); !strings.Contains(got, want) {
		t.Errorf("want %s; got:\n%s", want, got)
	}
}

// TestConnRefusedExportedFromStart: each door a gateway serves exports
// its refused-connections counter at 0 before its first refusal, so
// FaultlineGatewayRefusingConnections (deploy/monitoring) reads a series
// that `faultline dev` exports (TestMonitoringMetricsExported).
func TestConnRefusedExportedFromStart(t *testing.T) {
	for _, doors := range [][]string{{doorGRPC, doorREST}, {doorGRPC, doorREST, doorUnix}} {
		reg := prometheus.NewRegistry()
		s := &Server{log: slog.New(slog.DiscardHandler), metrics: newMetrics(reg), connWarns: warnlimit.New(warnWindow, warnKeys)}
		for _, d := range doors {
			s.connRefused(d)
		}
		got := metricText(t, reg, "faultline_gateway_connections_refused_total")
		for _, d := range doors {
			if want := fmt.Sprintf("{door=%q} 0\n", d); !strings.Contains(got, want) {
				t.Errorf("doors %v: want %s exported before any refusal; got:\n%s", doors, want, got)
			}
		}
	}
}
