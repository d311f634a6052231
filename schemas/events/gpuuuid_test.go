package events_test

import (
	"fmt"

	"github.com/faultline/faultline/schemas/events"
)

func ExampleIsGPUUUID() {
	for _, g := range []string{"GPU-4b2a9c1e-0d3f-4e5a-8b6c-7d8e9f0a1b2c", "0000:17:00.0", "index:3", "3", "GPU-a"} {
		fmt.Println(g, events.IsGPUUUID(g))
	}
	// Output:
	// GPU-4b2a9c1e-0d3f-4e5a-8b6c-7d8e9f0a1b2c true
	// 0000:17:00.0 false
	// index:3 false
	// 3 false
	// GPU-a false
}
