package report

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/faultline/faultline/agents/relay"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// relayCallTimeout bounds one call to the agent's relay (it answers once
// the events are fsync'd in its spool).
const relayCallTimeout = 10 * time.Second

// sendRelay sends the run's events to the node agent's relay socket
// (Config.RelaySocket: agents/relay, NVSentinel's PlatformConnector), in
// order, in as few calls as the relay's limits allow, each retried with
// backoff until the agent took it (its events are then in the agent's
// spool, fsync'd, for the agent's sender to deliver with the agent's
// node-bound credential) or ctx ends. A call the relay can never take
// (InvalidArgument, or PermissionDenied: an event for another node than
// the agent's) is not retried. It returns how many events were not
// recorded, and whether the socket never existed (no agent on the node).
func (r *Reporter) sendRelay(ctx context.Context, evs []*datamodels.HealthEvent) (lost int, noAgent bool) {
	if err := r.waitSocket(ctx); err != nil {
		r.log.Error("no faultline agent on this node: its relay socket did not appear in spool.drain_timeout; the check's events are not recorded",
			"socket", r.cfg.RelaySocket, "events", len(evs), "err", err)
		return len(evs), true
	}
	conn, err := grpc.NewClient("unix://"+r.cfg.RelaySocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		r.log.Error("cannot dial the agent's relay socket", "socket", r.cfg.RelaySocket, "err", err)
		return len(evs), false
	}
	defer conn.Close()
	client := datamodels.NewPlatformConnectorClient(conn)
	batches := relayBatches(evs)
	for i, b := range batches {
		err := r.relayCall(ctx, client, b)
		switch {
		case err == nil:
			continue
		case ctx.Err() != nil:
			for _, rest := range batches[i:] {
				lost += len(rest)
			}
			r.log.Error("the agent's relay did not take the events in spool.drain_timeout", "socket", r.cfg.RelaySocket,
				"events", lost, "err", err)
			return lost, false
		default:
			r.log.Error("the agent's relay refused events; they can never be delivered", "socket", r.cfg.RelaySocket,
				"events", len(b), "err", err)
			lost += len(b)
		}
	}
	return lost, false
}

// waitSocket waits, with backoff, until the relay socket exists (the
// agent, restarting, makes it again) or ctx ends (its error: the node has
// no agent, e.g. one not scheduled there or not yet rolled out).
func (r *Reporter) waitSocket(ctx context.Context) error {
	backoff := minBackoff
	for {
		_, err := os.Stat(r.cfg.RelaySocket)
		if err == nil || !errors.Is(err, fs.ErrNotExist) {
			return nil // there (or unreadable: the call says why)
		}
		r.log.Warn("the agent's relay socket does not exist; waiting for the agent", "socket", r.cfg.RelaySocket)
		if err := r.backOff(ctx, &backoff, err); err != nil {
			return err
		}
	}
}

// relayCall sends one batch until the relay takes it (nil), refuses it for
// good (the error), or ctx ends (the last error).
func (r *Reporter) relayCall(ctx context.Context, client datamodels.PlatformConnectorClient, evs []*datamodels.HealthEvent) error {
	backoff := minBackoff
	for {
		cctx, cancel := context.WithTimeout(ctx, relayCallTimeout)
		_, err := client.HealthEventOccurredV1(cctx, &datamodels.HealthEvents{Version: 1, Events: evs})
		cancel()
		if err == nil {
			return nil
		}
		if c := status.Code(err); c == codes.InvalidArgument || c == codes.PermissionDenied || c == codes.ResourceExhausted {
			return err
		}
		r.log.Warn("the agent's relay did not take the events; retrying", "socket", r.cfg.RelaySocket, "events", len(evs), "err", err)
		if err := r.backOff(ctx, &backoff, err); err != nil {
			return err
		}
	}
}

// minBackoff is the first wait of waitSocket's and relayCall's retries.
const minBackoff = 200 * time.Millisecond

// backOff waits *b, then doubles it up to gateway.max_backoff; when ctx
// ends first it returns ctx's error, with last (the retry's cause).
func (r *Reporter) backOff(ctx context.Context, b *time.Duration, last error) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w (last: %w)", ctx.Err(), last)
	case <-time.After(*b):
	}
	*b = min(2**b, max(r.cfg.Gateway.MaxBackoff, minBackoff))
	return nil
}

// relayBatches splits evs, in order, into calls the relay takes: at most
// relay.MaxBatch events and half relay.MaxMessageBytes each (an event
// larger alone goes alone; the relay names why it refuses it).
func relayBatches(evs []*datamodels.HealthEvent) [][]*datamodels.HealthEvent {
	var out [][]*datamodels.HealthEvent
	start, size := 0, 0
	for i, ev := range evs {
		n := ev.SizeVT() + 8
		if i > start && (i-start == relay.MaxBatch || size+n > relay.MaxMessageBytes/2) {
			out = append(out, evs[start:i])
			start, size = i, 0
		}
		size += n
	}
	if start < len(evs) {
		out = append(out, evs[start:])
	}
	return out
}
