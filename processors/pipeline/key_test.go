package pipeline

import (
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

func TestEventKey(t *testing.T) {
	ev := func(cluster, node string) []byte {
		b, err := events.Marshal(&datamodels.HealthEvent{
			Agent: "a", CheckName: "c", Cluster: cluster, NodeName: node, Message: strings.Repeat("m", 300),
			EntitiesImpacted: []*datamodels.Entity{{EntityType: "GPU", EntityValue: "GPU-1"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// A payload that names the cluster twice: the last one counts, as for
	// proto.Unmarshal.
	twice := protowire.AppendTag(ev("prod", "n1"), eventCluster, protowire.BytesType)
	twice = protowire.AppendString(twice, "staging")
	// A field number over protowire.MaxValidNumber, which proto.Unmarshal
	// rejects.
	overMax := protowire.AppendVarint(protowire.AppendTag(ev("prod", "n1"), protowire.MaxValidNumber+1, protowire.VarintType), 1)
	tests := []struct {
		name        string
		key         string
		value       []byte
		wantCluster string
		wantNode    string
		wantErr     string
	}{
		{"agree", "prod/n1", ev("prod", "n1"), "prod", "n1", ""},
		{"empty payload takes the key", "prod/_cluster", ev("prod", ""), "prod", "_cluster", ""},
		{"no cluster in payload", "prod/n1", ev("", "n1"), "prod", "n1", ""},
		{"cluster differs", "prod/n1", ev("staging", "n1"), "", "", `key "prod/n1" names cluster "prod", the event's cluster is "staging"`},
		{"node differs", "prod/n1", ev("prod", "n2"), "", "", `key "prod/n1" names node "n1", the event's nodeName is "n2"`},
		{"last cluster wins", "prod/n1", twice, "", "", `the event's cluster is "staging"`},
		{"bad key", "prod", ev("prod", "n1"), "", "", `record key "prod" is not cluster/node`},
		{"nil key", "", ev("prod", "n1"), "", "", `is not cluster/node`},
		{"malformed", "prod/n1", []byte{0x0a, 0x05, 'a'}, "", "", "malformed protobuf"},
		{"malformed: field number over the maximum", "prod/n1", overMax, "", "", "malformed protobuf: field number 536870912 is over the maximum"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, n, err := EventKey(&kgo.Record{Key: []byte(tc.key), Value: tc.value})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				if !strings.HasPrefix(tc.name, "malformed") && !errors.Is(err, ErrKeyMismatch) {
					t.Fatalf("err = %v, not ErrKeyMismatch", err)
				}
				return
			}
			if err != nil || c != tc.wantCluster || n != tc.wantNode {
				t.Fatalf("got %q %q %v, want %q %q", c, n, err, tc.wantCluster, tc.wantNode)
			}
		})
	}
}

func TestActionKey(t *testing.T) {
	for _, tc := range []struct {
		key, cluster, node string
		ok                 bool
	}{
		{"prod/n1", "prod", "n1", true},
		{"prod/n1", "staging", "n1", false},
		{"prod/n1", "prod", "n9", false},
	} {
		b, err := events.MarshalAction(&faultlinev1.Action{Id: "x", Cluster: tc.cluster, Node: tc.node, Role: "quarantine",
			Details: map[string]string{"entities": "GPU=GPU-1"}})
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = ActionKey(&kgo.Record{Key: []byte(tc.key), Value: b})
		if (err == nil) != tc.ok {
			t.Fatalf("%s vs %s/%s: err = %v", tc.key, tc.cluster, tc.node, err)
		}
	}
}
