package testenv_test

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/internal/testenv"
)

// The examples have no Output: they need a test's *testing.T and real
// servers, so they are compiled, not run.

func ExampleStartKafka() {
	var t *testing.T // the test's t

	k := testenv.StartKafka(t, testenv.KafkaPartitions(3))
	cl := k.Client(t, kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic("events"))
	if err := cl.ProduceSync(context.Background(), kgo.StringRecord("hello")).FirstErr(); err != nil {
		t.Fatal(err)
	}
	k.Stop()  // a broker outage
	k.Start() // same port, same log dir: the record is still there
}

func ExampleStartClickHouse() {
	var t *testing.T // the test's t

	ch := testenv.StartClickHouse(t)
	db := ch.DB(t)
	ctx := context.Background()
	if err := db.Exec(ctx, "CREATE TABLE t (a String) ENGINE = MergeTree() ORDER BY a"); err != nil {
		t.Fatal(err)
	}
	// 18.16 needs the column list in a batch insert.
	batch, err := db.PrepareBatch(ctx, "INSERT INTO t (a)")
	if err != nil {
		t.Fatal(err)
	}
	_ = batch.Append("x")
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
}

func ExampleStartKube() {
	var t *testing.T // the test's t

	k := testenv.StartKube(t, testenv.KubeOptions{ControllerManager: true, KWOK: true})
	nodes, err := k.Client().CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = nodes
	_ = k.Kubeconfig() // for a binary under test: --kubeconfig
	k.Stop()           // an API outage; etcd keeps the state
	k.Start()
}
