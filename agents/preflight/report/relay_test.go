package report

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/faultline/faultline/agents/agent"
	"github.com/faultline/faultline/agents/relay"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// startRelay serves the agent's relay (agents/relay) for node gpu-1 on a
// socket in a temporary directory, over a real agent spool, after delay
// (the agent starting, or restarting, while the check waits for it).
func startRelay(t *testing.T, delay time.Duration) (socket string, sp *agent.Spool) {
	t.Helper()
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	sp = agentSpool(t, dir)
	socket = filepath.Join(dir, "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		select {
		case <-ctx.Done():
			done <- nil
			return
		case <-time.After(delay):
		}
		srv, err := relay.New(relay.Config{Socket: socket}, "gpu-1", sp, log, prometheus.NewRegistry(), nil)
		if err != nil {
			done <- err
			return
		}
		done <- srv.Serve(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		sp.Close()
	})
	return socket, sp
}

// deadSocket is a socket nothing listens on any longer (an agent crashed,
// crash-looping): it exists, and refuses connections.
func deadSocket(t *testing.T) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return socket
}

// agentSpool is an agent's spool in dir.
func agentSpool(t *testing.T, dir string) *agent.Spool {
	t.Helper()
	sp, err := agent.OpenSpool(filepath.Join(dir, "spool"), 8<<20, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

// stoppedRelay is the socket of an agent's relay that was served and
// stopped cleanly (an upgrade's SIGTERM, a crash loop exiting on an
// error): it stays, refusing, so the check waits for the agent rather
// than take the node for one without an agent.
func stoppedRelay(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	sp := agentSpool(t, dir)
	defer sp.Close()
	socket := filepath.Join(dir, "agent.sock")
	srv, err := relay.New(relay.Config{Socket: socket}, "gpu-1", sp, slog.New(slog.DiscardHandler), prometheus.NewRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	return socket
}

// TestReportThroughRelay: with relay_socket a run's events go to the node
// agent's relay (which spools them, fsync'd, for the agent's sender and
// its node-bound credential): all of them, in order, unaltered but for the
// relay's idempotency key, and nothing is written under spool.dir. Events
// the relay refuses (another node's: the agent relays its own node's only)
// or a relay that is not there by the drain timeout are Lost, so the run
// exits non-zero (the check contract: exit 2 when the events could not be
// recorded); a refusal is not retried until the drain timeout.
func TestReportThroughRelay(t *testing.T) {
	for _, tt := range []struct {
		name        string
		node        string
		events      int
		relay       string // up, late (the agent restarting), dead (crash-looping), stopped (stopped cleanly), none (no agent on the node)
		wantLost    int
		wantNoAgent bool
		minTook     time.Duration
		maxTook     time.Duration
	}{
		{name: "own node", node: "gpu-1", events: 1200, relay: "up", maxTook: 10 * time.Second},
		{name: "another node", node: "gpu-2", events: 3, relay: "up", wantLost: 3, maxTook: 5 * time.Second},
		{name: "agent restarting", node: "gpu-1", events: 3, relay: "late", minTook: time.Second, maxTook: 10 * time.Second},
		{name: "agent crash-looping", node: "gpu-1", events: 3, relay: "dead", wantLost: 3, minTook: time.Second, maxTook: 10 * time.Second},
		{name: "agent stopped cleanly", node: "gpu-1", events: 3, relay: "stopped", wantLost: 3, minTook: time.Second, maxTook: 10 * time.Second},
		{name: "no agent on the node", node: "gpu-1", events: 3, relay: "none", wantLost: 3, wantNoAgent: true, minTook: time.Second, maxTook: 10 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Spool.Dir, cfg.Spool.DrainTimeout = filepath.Join(t.TempDir(), "spool"), 20*time.Second
			cfg.Gateway.TokenFile = filepath.Join(t.TempDir(), "no-token") // never read
			var sp *agent.Spool
			switch tt.relay {
			case "up":
				cfg.RelaySocket, sp = startRelay(t, 0)
			case "late":
				cfg.RelaySocket, sp = startRelay(t, time.Second)
			case "dead":
				cfg.RelaySocket, cfg.Spool.DrainTimeout = deadSocket(t), time.Second
			case "stopped":
				cfg.RelaySocket, cfg.Spool.DrainTimeout = stoppedRelay(t), time.Second
			default:
				cfg.RelaySocket, cfg.Spool.DrainTimeout = filepath.Join(t.TempDir(), "agent.sock"), time.Second
			}
			if err := cfg.Validate(); err != nil {
				t.Fatalf("Validate: %v (relay_socket needs no token)", err)
			}
			r, err := Open(cfg, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			var evs, sent []*datamodels.HealthEvent
			for i := range tt.events {
				ev := &datamodels.HealthEvent{Version: 1, Agent: "faultline-preflight-dcgm-diag", ComponentClass: "GPU", CheckName: "dcgm-diag",
					NodeName: tt.node, IsFatal: true, Message: fmt.Sprintf("GPU %d: memory test failed", i),
					ErrorCode:          []string{"DCGM_FR_FAULTY_MEMORY"},
					RecommendedAction:  datamodels.RecommendedAction_COMPONENT_RESET,
					ProcessingStrategy: datamodels.ProcessingStrategy_EXECUTE_REMEDIATION,
					EntitiesImpacted:   []*datamodels.Entity{{EntityType: "GPU", EntityValue: fmt.Sprintf("GPU-%08d-e50c-86a3-f752-3743a8c1bbb2", i)}},
					Metadata:           map[string]string{"pod": "training/job-0"},
					GeneratedTimestamp: timestamppb.New(time.Now().Add(-time.Second)), // as the runner stamps it
				}
				evs = append(evs, ev)
			}
			if err := r.Report(evs); err != nil {
				t.Fatal(err)
			}
			for _, ev := range evs {
				sent = append(sent, proto.Clone(ev).(*datamodels.HealthEvent))
			}
			start := time.Now()
			res := r.Flush(context.Background())
			took := time.Since(start)
			if res.Lost != tt.wantLost || res.NoAgent != tt.wantNoAgent || res.Pending != 0 || res.Adopted != 0 {
				t.Fatalf("Flush: %+v, want %d lost, no agent %v", res, tt.wantLost, tt.wantNoAgent)
			}
			if took > tt.maxTook || took < tt.minTook {
				t.Errorf("Flush took %s, want %s to %s", took.Round(time.Millisecond), tt.minTook, tt.maxTook)
			}
			if _, err := os.Stat(cfg.Spool.Dir); !os.IsNotExist(err) {
				t.Errorf("spool.dir %s was made (%v): the relay path has no spool of its own", cfg.Spool.Dir, err)
			}
			if sp == nil {
				return
			}
			got, _, err := sp.Peek(2000)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantLost > 0 {
				if len(got) != 0 {
					t.Fatalf("the agent spooled %d events of a refused call", len(got))
				}
				return
			}
			if len(got) != len(sent) {
				t.Fatalf("the agent spooled %d events, want %d", len(got), len(sent))
			}
			for i := range got {
				if got[i].GetId() == "" {
					t.Fatalf("event %d spooled without an id", i)
				}
				g := proto.Clone(got[i]).(*datamodels.HealthEvent)
				g.Id, sent[i].Id = "", ""
				if !proto.Equal(g, sent[i]) {
					t.Fatalf("event %d spooled as\n%v\nwant it as sent\n%v", i, g, sent[i])
				}
			}
			ids := make([]string, len(got))
			for i, ev := range got {
				ids[i] = ev.GetId()
			}
			slices.Sort(ids)
			if len(slices.Compact(ids)) != len(got) {
				t.Fatal("two events spooled under one id")
			}
		})
	}
}

// TestRelayBatches: a run's events are split, in order, into calls the
// relay takes.
func TestRelayBatches(t *testing.T) {
	small := &datamodels.HealthEvent{CheckName: "dcgm-diag"}
	large := &datamodels.HealthEvent{CheckName: "dcgm-diag", Message: string(make([]byte, relay.MaxMessageBytes/3))}
	for _, tt := range []struct {
		name string
		evs  []*datamodels.HealthEvent
		want []int
	}{
		{"none", nil, nil},
		{"one call", slices.Repeat([]*datamodels.HealthEvent{small}, 3), []int{3}},
		{"batch limit", slices.Repeat([]*datamodels.HealthEvent{small}, relay.MaxBatch+1), []int{relay.MaxBatch, 1}},
		{"size limit", []*datamodels.HealthEvent{small, large, large, small}, []int{2, 2}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got []int
			n := 0
			for _, b := range relayBatches(tt.evs) {
				got = append(got, len(b))
				for _, ev := range b {
					if ev != tt.evs[n] {
						t.Fatalf("event %d out of order", n)
					}
					n++
				}
			}
			if !slices.Equal(got, tt.want) || n != len(tt.evs) {
				t.Fatalf("batches %v, want %v", got, tt.want)
			}
		})
	}
}
