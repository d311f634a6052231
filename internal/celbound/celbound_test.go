package celbound

import (
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
)

// sample is an event's variables as a caller builds them for an empty
// record: the shape Compile estimates from.
func sample() map[string]any {
	return map[string]any{"event": map[string]any{
		"checkName": "", "message": "", "isFatal": false,
		"errorCode": []any{}, "entitiesImpacted": []any{}, "metadata": map[string]any{},
	}}
}

// largest is an event at the sizes: every list and map MaxItems entries,
// every string MaxBytes bytes, none matching what the expressions look for
// (so no comprehension stops early).
func largest() map[string]any {
	s := func(i int) string {
		return strings.Repeat("v", MaxBytes-3) + string(rune('a'+i/26%26)) + string(rune('a'+i%26)) + "-"
	}
	var codes, ents []any
	md := map[string]any{}
	for i := range MaxItems {
		codes = append(codes, s(i))
		ents = append(ents, map[string]any{"entityType": s(i), "entityValue": s(i)})
		md[s(i)] = s(i)
	}
	return map[string]any{"event": map[string]any{
		"checkName": s(0), "message": s(1), "isFatal": true,
		"errorCode": codes, "entitiesImpacted": ents, "metadata": md,
	}}
}

func compile(t *testing.T, src string, limit uint64) *Program {
	t.Helper()
	env, err := cel.NewEnv(cel.Variable("event", cel.MapType(cel.StringType, cel.DynType)))
	if err != nil {
		t.Fatal(err)
	}
	ast, iss := env.Compile(src)
	if iss.Err() != nil {
		t.Fatal(iss.Err())
	}
	p, err := Compile(env, ast, sample(), limit, cel.EvalOptions(cel.OptOptimize))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBoundHolds: on the largest event that fits, every expression costs
// at most its estimate (the tracker's count), and the untracked form gives
// the tracked form's answer.
func TestBoundHolds(t *testing.T) {
	vars := largest()
	if !Fits(vars) {
		t.Fatal("the largest event does not fit")
	}
	for _, src := range []string{
		`event.checkName in ['a', 'b'] && !event.isFatal`,
		`event.entitiesImpacted.exists(e, e.entityType == 'NICPort')`,
		`event.errorCode.exists(c, c in ['XID-74', 'XID-45'])`,
		`'link_downed' in event.errorCode`,
		`event.message.matches('a+b+c$')`,
		`event.message.contains('zzz') || event.message.startsWith('x') || event.message.endsWith('y')`,
		`size(event.message) < 3 || size(event.entitiesImpacted) < 3`,
		`'x' in event.metadata || event.metadata.exists(k, event.metadata[k] == 'x')`,
		`event.entitiesImpacted.map(e, e.entityValue).filter(v, v.contains('q')).size() > 0`,
		`event.entitiesImpacted.exists(a, event.entitiesImpacted.exists(b, a.entityValue + b.entityValue == 'q'))`,
		`event.entitiesImpacted[0].entityType == 'q' || event.entitiesImpacted.exists(e, e.entityType == e.entityValue)`,
		`event.entitiesImpacted.exists(e, e.entityType == 'a' || e.entityType == 'b' || e.entityType == 'c' || e.entityValue == 'd')`,
		`event.message + event.checkName == event.checkName + event.message`,
	} {
		t.Run(src, func(t *testing.T) {
			p := compile(t, src, 1<<40)
			if p.fast == nil || p.Bound == 0 {
				t.Fatalf("no bound (estimate over 2^40?)")
			}
			want, det, err := p.tracked.Eval(vars)
			if err != nil {
				t.Fatal(err)
			}
			if cost := *det.ActualCost(); cost > p.Bound {
				t.Errorf("cost %d on the largest event, estimate %d", cost, p.Bound)
			}
			got, err := p.Eval(vars, true)
			if err != nil || got != want.Value() {
				t.Errorf("untracked %v, %v; tracked %v", got, err, want.Value())
			}
		})
	}
}

// TestOverTheLimit: an expression whose estimate exceeds the limit runs
// tracked on every event and stops at the limit; one within it runs
// tracked on an event that does not fit.
func TestOverTheLimit(t *testing.T) {
	vars := largest()
	costly := compile(t, `event.entitiesImpacted.exists(a, event.entitiesImpacted.exists(b, event.entitiesImpacted.exists(c, a.entityValue + b.entityValue + c.entityValue == 'q')))`, 10_000)
	if costly.fast != nil || costly.Bound != 0 {
		t.Fatalf("untracked form kept, bound %d", costly.Bound)
	}
	if _, err := costly.Eval(vars, true); err == nil || !strings.Contains(err.Error(), "cost limit") {
		t.Fatalf("err = %v, want the cost limit", err)
	}

	chain := compile(t, `event.entitiesImpacted.exists(e, e.entityType.x == 'q')`, 10_000)
	if chain.fast != nil {
		t.Fatal("a chain of reads from dyn values kept its untracked form")
	}

	cheap := compile(t, `event.errorCode.exists(c, c == 'q')`, 10_000)
	if cheap.fast == nil {
		t.Fatal("no untracked form")
	}
	codes := make([]any, 20_000)
	for i := range codes {
		codes[i] = "x"
	}
	big := map[string]any{"event": map[string]any{"errorCode": codes}}
	if Fits(big) {
		t.Fatal("20,000 codes fit")
	}
	if _, err := cheap.Eval(big, Fits(big)); err == nil || !strings.Contains(err.Error(), "cost limit") {
		t.Fatalf("err = %v, want the cost limit", err)
	}
}

func TestFits(t *testing.T) {
	items := func(n int) []any { return make([]any, n) }
	keys := func(n int) map[string]any {
		m := map[string]any{}
		for i := range n {
			m[strings.Repeat("k", i+1)] = "v"
		}
		return m
	}
	for _, tc := range []struct {
		name string
		v    any
		want bool
	}{
		{"scalars", map[string]any{"a": true, "b": int64(3), "c": nil}, true},
		{"string at the size", strings.Repeat("x", MaxBytes), true},
		{"string over", strings.Repeat("x", MaxBytes+1), false},
		{"list at the size", items(MaxItems), true},
		{"list over", items(MaxItems + 1), false},
		{"map at the size", keys(MaxItems), true},
		{"map over", keys(MaxItems + 1), false},
		{"key over", map[string]any{strings.Repeat("k", MaxBytes+1): "v"}, false},
		{"nested string over", map[string]any{"e": []any{map[string]any{"v": strings.Repeat("x", MaxBytes+1)}}}, false},
		{"nested list over", []any{map[string]any{"l": items(MaxItems + 1)}}, false},
	} {
		if got := Fits(tc.v); got != tc.want {
			t.Errorf("%s: Fits = %v, want %v", tc.name, got, tc.want)
		}
	}
}
