package events

// The vocabulary of the actions topic (faultline.v1.Action): the contract
// between the processor roles. The quarantine role's decisions start a
// drain; the drain's results start a remediation; the store, the history
// API and the analytics queries read all of them. A role reads another
// role's actions through these names only, never through the other role's
// package.

// Processor roles that write actions (Action.role).
const (
	RoleQuarantine = "quarantine"
	RoleDrain      = "drain"
	RoleRemediate  = "remediate"
	RoleJanitor    = "janitor"
	// RoleConformance: the conformance role's drift responses.
	RoleConformance = "conformance"
)

// Action kinds (Action.kind).
const (
	// KindQuarantine: a fault was decided on (cordon, taint, condition).
	KindQuarantine = "quarantine"
	// KindUnquarantine: a recovery lifted what faultline set.
	KindUnquarantine = "unquarantine"
	// KindSkip: an event was deliberately not acted on (STORE_ONLY, no
	// rule matched, opted out, an older recovery).
	KindSkip = "skip"
	// KindEvent: a non-fatal event recorded as a Kubernetes Event.
	KindEvent = "event"
	// KindManualUncordon: a person uncordoned a quarantined node; its
	// standing faults no longer cordon it.
	KindManualUncordon = "manual_uncordon"
	// KindBreakerOpen and KindBreakerClose: the cluster's quarantine
	// circuit breaker changed state.
	KindBreakerOpen  = "breaker_open"
	KindBreakerClose = "breaker_close"
	// KindDrain: every action of the drain role.
	KindDrain = "drain"
	// KindRemediate: a remediation resource was created, joined or
	// followed to its result.
	KindRemediate = "remediate"
	// KindPrune: a finished remediation resource older than the remediate
	// role's retention was deleted.
	KindPrune = "prune"
	// KindEscalate: the node was escalated to CONTACT_SUPPORT (the
	// remediate role), or a drifted node was escalated to a fatal event
	// after the conformance role's drift_remediation_timeout.
	KindEscalate = "escalate"
	// KindReboot, KindTerminate and KindGPUReset: the janitor's steps of a
	// RebootNode, TerminateNode or GPUReset (signal sent, forced,
	// completed, failed, deferred by a limit).
	KindReboot    = "reboot"
	KindTerminate = "terminate"
	KindGPUReset  = "gpu_reset"
	// KindConformanceDrift: a node was found drifted from its conformance
	// group (PreferNoSchedule taint, group label, Kubernetes Event).
	KindConformanceDrift = "conformance_drift"
	// KindConformanceRestored: a drifted node conforms again; what the
	// conformance role set was removed.
	KindConformanceRestored = "conformance_restored"
	// KindConformanceDrain: a drifted sensitive node was sent down the
	// quarantine path (a fatal event: cordon, taint, drain).
	KindConformanceDrain = "conformance_drain"
	// KindConformanceUndrain: a sensitive node conforms again and was
	// approved; the recovery event lifts its quarantine. Outcome
	// in_progress while it conforms but waits for approval.
	KindConformanceUndrain = "conformance_undrain"
	// KindConformanceNotify: the remediation notifier (e.g. OpenCHAMI
	// SMD) was told of a drift or its end.
	KindConformanceNotify = "conformance_notify"
)

// Outcomes (Action.outcome).
const (
	// OutcomeApplied: the change was made in the cluster.
	OutcomeApplied = "applied"
	// OutcomeDryRun: decided, not applied (dry-run or unconfigured cluster).
	OutcomeDryRun = "dry_run"
	// OutcomeHeld: a quarantine held back by the circuit breaker.
	OutcomeHeld = "held_by_breaker"
	// OutcomeSkipped: deliberately not acted on.
	OutcomeSkipped = "skipped"
	// OutcomeFailed: the action could not be carried out.
	OutcomeFailed = "failed"
	// OutcomeInProgress: started or joined, not finished (a drain
	// started, a fault recovered while others stand, a remediation in
	// progress).
	OutcomeInProgress = "in_progress"
	// OutcomeDecided: recorded, nothing to apply (a manual uncordon).
	OutcomeDecided = "decided"
	// OutcomeBlocked: a drain's evictions are refused by
	// PodDisruptionBudgets (Details[DetailBlockedBy]).
	OutcomeBlocked = "blocked"
	// OutcomeSucceeded: a drain or remediation finished.
	OutcomeSucceeded = "succeeded"
	// OutcomeGaveUp: a drain ended with pods its policy stopped waiting for.
	OutcomeGaveUp = "gave_up"
	// OutcomeCancelled: a drain stopped because the node is no longer
	// quarantined; a remediation its operator did not attempt because the
	// node was no longer quarantined and drained (the janitor's NotDrained).
	OutcomeCancelled = "cancelled"
	// OutcomeRefused: a rendered remediation object did not target the
	// event's node; nothing was created.
	OutcomeRefused = "refused"
	// OutcomeDeferred: a janitor operation waits for a concurrency limit
	// or a node's cooldown; a flapping fault's recovery (unquarantine)
	// waits for its stabilization window.
	OutcomeDeferred = "deferred"
)

// Detail keys (Action.details) that travel from one role to the next: the
// quarantine role copies them from the event, the drain carries them on to
// the remediate role.
const (
	// DetailEntities is the event's impacted entities, events.EntityKey
	// form ("GPU=GPU-1,NIC=mlx5_0").
	DetailEntities = "entities"
	// DetailDrainOverrides is the event's drainOverrides: "force" or
	// "skip". The drain honours it only when DetailSubmitterRole is
	// "operator".
	DetailDrainOverrides = "drainOverrides"
	// DetailCustomAction is the event's customRecommendedAction (CUSTOM).
	DetailCustomAction = "customRecommendedAction"
	// DetailSubmitterRole is "agent", "operator" or "pipeline" (RoleName
	// of the event's submitter).
	DetailSubmitterRole = "submitterRole"
	// DetailSubmitter is the name of the credential that sent the event.
	DetailSubmitter = "submitter"
	// DetailOverridesIgnored says which overrides were ignored and why
	// ("quarantineOverrides.force ignored: sent by agent credential
	// token:prod#3f9a1c0e7b24d865").
	DetailOverridesIgnored = "overridesIgnored"
	// DetailGPUPods and DetailGPUPodsAt are the event's MetaGPUPods and
	// MetaGPUPodsAt: the pods a GPU reset's drain evicts.
	DetailGPUPods   = MetaGPUPods
	DetailGPUPodsAt = MetaGPUPodsAt
	// DetailGeneratedAt is when the fault was generated (the event's
	// generatedTimestamp, RFC 3339 with nanoseconds, UTC); on a drain's
	// result the newest of the faults it served. The remediate role
	// compares it with its resources: a fault generated before a
	// remediation that succeeded started is answered by it (a repeat the
	// agent spooled across the reboot), not remediated again.
	DetailGeneratedAt = "generatedAt"
	// DetailDrainID identifies a drain; the remediate role keys its
	// resources' triggers by it.
	DetailDrainID = "drainId"
	// DetailScope is a drain's scope: "node" or "gpu:<uuid>[,<uuid>]".
	DetailScope = "scope"
	// DetailBlockedBy names the PDBs refusing a drain's evictions.
	DetailBlockedBy = "blockedBy"
	// DetailForce is "true" when an operator's force applied.
	DetailForce = "force"
	// DetailRemaining counts what is still standing: faults after an
	// unquarantine, pods after a drain step.
	DetailRemaining = "remaining"
	// DetailNodeCreated is the creationTimestamp of the Node object a
	// quarantine was applied to, or a drain step read (RFC 3339, UTC). A
	// node name outlives its machine (a replacement registers a new Node
	// under the same name): the MultipleRemediations rule
	// (sql/rules/remediations.sql) counts a node's remediations only from
	// its newest Node object's creation, and the remediate role neither
	// escalates for, joins nor counts in the budget the resources made
	// before it.
	DetailNodeCreated = "nodeCreated"
)

// Detail keys a role writes for people and the analytics queries (read
// by no other role).
const (
	// Quarantine decisions.
	DetailCordon             = "cordon"
	DetailAlreadyQuarantined = "alreadyQuarantined"
	DetailPreexistingCordon  = "preexistingCordon"
	DetailTaint              = "taint"
	DetailRuleErrors         = "ruleErrors"
	DetailRecovered          = "recovered"
	DetailUncordoned         = "uncordoned"
	// DetailStabilizing lists the flapping faults a recovery left
	// standing until DetailLiftAt (RFC 3339).
	DetailStabilizing = "stabilizing"
	DetailLiftAt      = "liftAt"
	// Circuit breaker transitions.
	DetailBreakerCount       = "count"
	DetailBreakerLimit       = "limit"
	DetailBreakerTotal       = "total"
	DetailBreakerSchedulable = "schedulable"
	// Drain counts and plans.
	DetailInScope    = "inScope"
	DetailEvicted    = "evicted"
	DetailDeleted    = "deleted"
	DetailCompleted  = "completed"
	DetailGaveUp     = "gaveUp"
	DetailSkipped    = "skipped"
	DetailWouldDrain = "wouldDrain"
	// DetailSkippedTerminating lists the pods ("ns/name@uid8") a drain
	// stopped waiting for: terminating longer than its
	// skip_wait_for_delete_timeout past their DeletionTimestamp.
	DetailSkippedTerminating = "skippedTerminating"
	// Remediations.
	DetailResource        = "resource"
	DetailTemplate        = "template"
	DetailRequestedAction = "requestedAction"
	DetailGroup           = "group"
	// Janitor operations: the provider that carried it out and the step
	// (signal, force, complete, ...).
	DetailProvider = "provider"
	DetailStep     = "step"
	// DetailNodeNamed lists the keys of the node's own (its kubelet may
	// write them) that a janitor signal followed: the annotation naming
	// its provider or its BMC ("faultline.io/janitor-provider,
	// faultline.io/bmc-address").
	DetailNodeNamed = "nodeNamed"
	// Conformance drift: the group (cluster/pool), where its expected
	// fingerprint comes from (baseline or majority), the expected and
	// actual fingerprints, the differing components ("name: expected
	// \"a\", actual \"b\"; ..."), the drift's start (RFC 3339).
	DetailConformanceGroup = "conformanceGroup"
	DetailBasis            = "basis"
	DetailExpected         = "expected"
	DetailActual           = "actual"
	DetailDiffering        = "differing"
	DetailDriftSince       = "driftSince"
	DetailAttempts         = "attempts"
)

// LabelQuarantined is the node label the quarantine role sets to "true"
// while faultline holds the node quarantined; the drain role stops a
// drain whose node lost it.
const LabelQuarantined = "faultline.io/quarantined"
