package events

import (
	"strings"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// SubmitterRole is the role of the credential that sent ev, as the
// processors judge it: an event without a submitter (an older record, or
// one no gateway stamped) or with an unknown role counts as
// SUBMITTER_ROLE_AGENT, the least trusted.
func SubmitterRole(ev *datamodels.HealthEvent) datamodels.SubmitterRole {
	switch r := ev.GetSubmitter().GetRole(); r {
	case datamodels.SubmitterRole_SUBMITTER_ROLE_OPERATOR, datamodels.SubmitterRole_SUBMITTER_ROLE_PIPELINE:
		return r
	}
	return datamodels.SubmitterRole_SUBMITTER_ROLE_AGENT
}

// IsOperator reports whether ev was sent with an operator credential, the
// only kind whose quarantineOverrides and drainOverrides take effect.
func IsOperator(ev *datamodels.HealthEvent) bool {
	return SubmitterRole(ev) == datamodels.SubmitterRole_SUBMITTER_ROLE_OPERATOR
}

// RoleName is the short lower-case name of a submitter role: "agent",
// "operator", "pipeline" (UNSPECIFIED and unknown values: "agent", as
// SubmitterRole judges them).
func RoleName(r datamodels.SubmitterRole) string {
	switch r {
	case datamodels.SubmitterRole_SUBMITTER_ROLE_OPERATOR:
		return "operator"
	case datamodels.SubmitterRole_SUBMITTER_ROLE_PIPELINE:
		return "pipeline"
	}
	return "agent"
}

// DescribeSubmitter names who sent ev for an audit reason: "agent
// credential token:prod#3f9a1c0e7b24d865", "operator credential
// cert:alice", "agent credential (none recorded)" for an event without a
// submitter.
func DescribeSubmitter(ev *datamodels.HealthEvent) string {
	s := RoleName(SubmitterRole(ev)) + " credential "
	name := ev.GetSubmitter().GetName()
	if name == "" {
		return s + "(none recorded)"
	}
	return s + Truncate(strings.ToValidUTF8(name, "?"), 128)
}
