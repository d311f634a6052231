//go:build !cgo

package gpu

import (
	"context"
	"errors"
	"log/slog"
)

// NVML is the NVML Source; without cgo it cannot load the library and
// reports an error on every call (build with CGO_ENABLED=1).
type NVML struct {
	// Logger is unused without cgo.
	Logger *slog.Logger
}

// NewNVML returns the NVML Source.
func NewNVML() *NVML { return &NVML{} }

// Health implements Source.
func (*NVML) Health(context.Context) ([]Incident, error) {
	return nil, errors.New("gpu: built without cgo, NVML unavailable")
}
