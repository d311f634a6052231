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

func ExampleCanonicalGPUUUID() {
	for _, g := range []string{"GPU-4B2A9C1E-0D3F-4E5A-8B6C-7D8E9F0A1B2C", "GPU-4b2a9c1e-0d3f-4e5a-8b6c-7d8e9f0a1b2c", "MIG-ABC", "0000:17:00.0"} {
		fmt.Println(events.CanonicalGPUUUID(g))
	}
	// Output:
	// GPU-4b2a9c1e-0d3f-4e5a-8b6c-7d8e9f0a1b2c
	// GPU-4b2a9c1e-0d3f-4e5a-8b6c-7d8e9f0a1b2c
	// MIG-ABC
	// 0000:17:00.0
}
