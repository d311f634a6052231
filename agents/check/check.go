// Package check is the contract between the node agent and its checks.
//
// A check reads local facts (sysfs, kernel log, tool output), keeps just
// enough state to report transitions, and returns raw HealthEvents. Checks
// never talk to the gateway, Kafka, ClickHouse or Kubernetes: the agent's
// runner calls Check on a schedule, each call with its own deadline, recovers
// panics, and sends what it returns.
package check

import (
	"context"
	"time"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Check is one source of HealthEvents on a node.
type Check interface {
	// Name is the check's name as used in flags, config and metrics
	// ("nic", "kmsg", "fabric", "gpu", ...).
	Name() string
	// Check returns the events to report since the previous call: only
	// boundary crossings (healthy→unhealthy, unhealthy→healthy) and one-off
	// occurrences, never the same standing state again. The runner fills
	// in nodeName, agent and generatedTimestamp where they are empty.
	// "Hardware not present" is not an error: it returns no events.
	Check(ctx context.Context) ([]*datamodels.HealthEvent, error)
}

// Committer is a Check that persists state across restarts (a read
// position, the states it reported). The runner calls Commit once the
// events of the last Check call are in the spool (at once when there were
// none), and not when they could not be spooled: a crash or an OOM kill
// before it leaves the state from which a restart reports them again,
// instead of a state that says they were reported.
type Committer interface {
	Commit() error
}

// Retrier is a Check that may ask to run again sooner than its interval
// (the conformance check after a collection with unreadable components:
// a driver not loaded yet after a reboot). The runner asks it after each
// run: a positive duration shorter than the check's interval is the wait
// before the next run; otherwise the next run is an interval later.
type Retrier interface {
	RetryIn() time.Duration
}
