package events

import (
	"testing"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

func TestSubmitter(t *testing.T) {
	for _, tc := range []struct {
		sub      *datamodels.Submitter
		operator bool
		describe string
	}{
		{nil, false, "agent credential (none recorded)"},
		{&datamodels.Submitter{}, false, "agent credential (none recorded)"},
		{&datamodels.Submitter{Name: "token:prod#3", Role: datamodels.SubmitterRole_SUBMITTER_ROLE_AGENT}, false, "agent credential token:prod#3"},
		{&datamodels.Submitter{Name: "x", Role: datamodels.SubmitterRole(42)}, false, "agent credential x"},
		{&datamodels.Submitter{Name: "RepeatedNICLinkFlap", Role: datamodels.SubmitterRole_SUBMITTER_ROLE_PIPELINE}, false, "pipeline credential RepeatedNICLinkFlap"},
		{&datamodels.Submitter{Name: "cert:alice", Role: datamodels.SubmitterRole_SUBMITTER_ROLE_OPERATOR}, true, "operator credential cert:alice"},
	} {
		ev := &datamodels.HealthEvent{Submitter: tc.sub}
		if IsOperator(ev) != tc.operator || DescribeSubmitter(ev) != tc.describe {
			t.Errorf("%v: operator %v, %q; want %v, %q", tc.sub, IsOperator(ev), DescribeSubmitter(ev), tc.operator, tc.describe)
		}
		if r := Vars(ev)["submitter"].(map[string]any)["role"]; r != RoleName(SubmitterRole(ev)) {
			t.Errorf("%v: CEL role %v", tc.sub, r)
		}
	}
}
