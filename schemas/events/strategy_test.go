package events

import (
	"testing"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestStrategies: which roles leave an event alone, by processingStrategy.
func TestStrategies(t *testing.T) {
	for _, tt := range []struct {
		s                    datamodels.ProcessingStrategy
		storeOnly, neverActs bool
	}{
		{datamodels.ProcessingStrategy_UNSPECIFIED, false, false},
		{datamodels.ProcessingStrategy_EXECUTE_REMEDIATION, false, false},
		{datamodels.ProcessingStrategy_STORE_ONLY, true, true},
		{datamodels.ProcessingStrategy_STORE_AND_ANALYSE, false, true},
	} {
		ev := &datamodels.HealthEvent{ProcessingStrategy: tt.s}
		if StoreOnly(ev) != tt.storeOnly || NeverActs(ev) != tt.neverActs {
			t.Errorf("%v: StoreOnly %t NeverActs %t, want %t %t", tt.s, StoreOnly(ev), NeverActs(ev), tt.storeOnly, tt.neverActs)
		}
	}
	if NeverActs(nil) || StoreOnly(nil) {
		t.Error("a nil event")
	}
}
