package fleet

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// NodeCalls is the kube-apiservers' own count of requests for Node
// objects (apiserver_request_total{resource="nodes"}), by verb and
// subresource ("PATCH status"), whatever their answer: a patch refused with a conflict, the
// GET after it and a patch that changed nothing are calls, though no
// watch sees them.
type NodeCalls struct {
	Verbs     map[string]int64 // GET, PATCH, PATCH status, UPDATE, LIST, WATCH, ...
	Conflicts int64            // of them answered 409
}

// notPerNode are the verbs of informers (the watchers', the roles'):
// one call for many nodes.
var notPerNode = []string{"LIST", "WATCH"}

// PerNodeCalls is the calls of every verb but LIST and WATCH.
func (c NodeCalls) PerNodeCalls() int64 {
	var n int64
	for v, k := range c.Verbs {
		if !slices.Contains(notPerNode, v) {
			n += k
		}
	}
	return n
}

// Since is c less an earlier count.
func (c NodeCalls) Since(before NodeCalls) NodeCalls {
	d := NodeCalls{Verbs: map[string]int64{}, Conflicts: c.Conflicts - before.Conflicts}
	for v, k := range c.Verbs {
		if k -= before.Verbs[v]; k != 0 {
			d.Verbs[v] = k
		}
	}
	return d
}

// String is "GET 5, PATCH 2000 (10 of them refused 409); LIST 3,
// WATCH 2 not per node".
func (c NodeCalls) String() string {
	var per, not []string
	for _, v := range slices.Sorted(maps.Keys(c.Verbs)) {
		s := fmt.Sprintf("%s %d", v, c.Verbs[v])
		if slices.Contains(notPerNode, v) {
			not = append(not, s)
		} else {
			per = append(per, s)
		}
	}
	out := strings.Join(per, ", ")
	if c.Conflicts > 0 {
		out += fmt.Sprintf(" (%d of them refused 409)", c.Conflicts)
	}
	if len(not) > 0 {
		out += "; " + strings.Join(not, ", ") + " not per node"
	}
	return out
}

// parseNodeCalls reads a kube-apiserver's /metrics.
func parseNodeCalls(r io.Reader) (NodeCalls, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return NodeCalls{}, fmt.Errorf("apiserver metrics: %w", err)
	}
	c := NodeCalls{Verbs: map[string]int64{}}
	for _, m := range fams["apiserver_request_total"].GetMetric() {
		l := map[string]string{}
		for _, lp := range m.GetLabel() {
			l[lp.GetName()] = lp.GetValue()
		}
		if l["resource"] != "nodes" || l["group"] != "" {
			continue
		}
		verb := l["verb"]
		if l["subresource"] != "" {
			verb += " " + l["subresource"] // PATCH status: a node's conditions
		}
		n := int64(m.GetCounter().GetValue())
		c.Verbs[verb] += n
		if l["code"] == "409" {
			c.Conflicts += n
		}
	}
	return c, nil
}

// NodeCalls sums the apiservers' counts of requests for Node objects
// (the admin token may read /metrics).
func (e *Env) NodeCalls(ctx context.Context) (NodeCalls, error) {
	sum := NodeCalls{Verbs: map[string]int64{}}
	for _, c := range e.Clusters {
		b, err := e.Kubes[c].Client().CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			return NodeCalls{}, fmt.Errorf("%s: apiserver metrics: %w", c, err)
		}
		n, err := parseNodeCalls(bytes.NewReader(b))
		if err != nil {
			return NodeCalls{}, fmt.Errorf("%s: %w", c, err)
		}
		for v, k := range n.Verbs {
			sum.Verbs[v] += k
		}
		sum.Conflicts += n.Conflicts
	}
	return sum, nil
}
