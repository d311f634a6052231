package analytics_test

import (
	"os"

	"github.com/faultline/faultline/internal/analytics"
)

func ExampleParams() {
	p := analytics.Params{}
	_ = p.Set("cluster=alpha")
	_ = p.Set("since=now-7d")
	os.Stdout.WriteString(p.String() + "\n")
	// Output: cluster=alpha,since=now-7d
}
