package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/faultline/faultline/internal/config"
)

// Notification tells the infrastructure that a node drifted or conforms
// again.
type Notification struct {
	Cluster, Node, Xname string
	// Drifted: true for a drift, false for its end.
	Drifted          bool
	Expected, Actual string
	// Key identifies the notification (its drift) in the audit.
	Key string
}

// Notifier delivers one notification, once (the queue retries).
type Notifier interface {
	Notify(ctx context.Context, n Notification) error
}

// HTTPNotifier PATCHes OpenCHAMI SMD's component state
// (PATCH /hsm/v2/State/Components/{xname}, the seed's call):
// {"Flag":"Warning","FlagMsg":"conformance_drift: expected=<a>, actual=<b>"}
// on drift, {"Flag":"OK","FlagMsg":"conformance_restored: actual=<b>"}
// when the node conforms again. Any 2xx is success.
type HTTPNotifier struct {
	cfg    NotifierConfig
	client *http.Client
}

// NewHTTPNotifier returns the notifier of cfg (cfg.URL set).
func NewHTTPNotifier(cfg NotifierConfig, client *http.Client) *HTTPNotifier {
	if client == nil {
		client = &http.Client{Timeout: cfg.Timeout}
	}
	return &HTTPNotifier{cfg: cfg, client: client}
}

// Notify sends one PATCH.
func (h *HTTPNotifier) Notify(ctx context.Context, n Notification) error {
	u := strings.NewReplacer("{node}", url.PathEscape(n.Node), "{xname}", url.PathEscape(n.Xname)).Replace(h.cfg.URL)
	body := map[string]string{"Flag": "OK", "FlagMsg": "conformance_restored: actual=" + n.Actual}
	if n.Drifted {
		body = map[string]string{"Flag": "Warning", "FlagMsg": fmt.Sprintf("conformance_drift: expected=%s, actual=%s", n.Expected, n.Actual)}
	}
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, u, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if h.cfg.TokenFile != "" {
		tok, err := config.ReadSecret(h.cfg.TokenFile, "")
		if err != nil {
			return fmt.Errorf("notifier.token_file: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+tok.Reveal())
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("PATCH %s: %s: %s", u, resp.Status, strings.TrimSpace(string(msg)))
	}
	return nil
}

// Queue delivers notifications in the background, each retried with
// exponential backoff up to Attempts times, at most 16 at once and one
// node's in the order queued (a return never overtakes its drift); Enqueue
// never blocks (a full queue refuses). Done is called with each
// notification's result.
type Queue struct {
	n    Notifier
	cfg  NotifierConfig
	ch   chan Notification
	log  *slog.Logger
	done func(n Notification, attempts int, err error)
	// sleep waits between attempts (tests shorten it).
	sleep func(ctx context.Context, d time.Duration) error
}

// NewQueue returns a queue over n; done gets every result.
func NewQueue(n Notifier, cfg NotifierConfig, log *slog.Logger, done func(Notification, int, error)) *Queue {
	return &Queue{n: n, cfg: cfg, ch: make(chan Notification, cfg.Queue), log: log, done: done, sleep: sleepCtx}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Enqueue queues n; false when the queue is full.
func (q *Queue) Enqueue(n Notification) bool {
	select {
	case q.ch <- n:
		return true
	default:
		return false
	}
}

// Run delivers until ctx ends.
func (q *Queue) Run(ctx context.Context) error {
	sem := make(chan struct{}, 16)
	var (
		wg sync.WaitGroup
		mu sync.Mutex
		// behind: the notifications waiting for their node's delivery in
		// progress, by cluster/node (a key present: one is in progress).
		behind = map[string][]Notification{}
	)
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return nil
		case n := <-q.ch:
			key := n.Cluster + "/" + n.Node
			mu.Lock()
			waiting, busy := behind[key]
			if busy {
				behind[key] = append(waiting, n)
			} else {
				behind[key] = nil
			}
			mu.Unlock()
			if busy {
				continue
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return nil
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				for {
					q.deliver(ctx, n)
					mu.Lock()
					next := behind[key]
					if len(next) == 0 || ctx.Err() != nil {
						delete(behind, key)
						mu.Unlock()
						return
					}
					n, behind[key] = next[0], next[1:]
					mu.Unlock()
				}
			}()
		}
	}
}

func (q *Queue) deliver(ctx context.Context, n Notification) {
	backoff := q.cfg.MinBackoff
	var err error
	for attempt := 1; attempt <= q.cfg.Attempts; attempt++ {
		if err = q.n.Notify(ctx, n); err == nil {
			q.done(n, attempt, nil)
			return
		}
		q.log.Warn("conformance notifier failed", "cluster", n.Cluster, "node", n.Node, "attempt", attempt, "err", err)
		if attempt == q.cfg.Attempts {
			break
		}
		if q.sleep(ctx, backoff) != nil {
			q.done(n, attempt, fmt.Errorf("stopped: %w", err))
			return
		}
		backoff = min(2*backoff, q.cfg.MaxBackoff)
	}
	q.done(n, q.cfg.Attempts, err)
}
