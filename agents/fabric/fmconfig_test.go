package fabric

import "testing"

// TestLogsToJournal: FM logs to the unit's journal with LOG_USE_SYSLOG set
// to anything but 0 (how FM reads values other than 0 and 1 is not
// documented: the journal is read too, at little cost) or LOG_FILE_NAME
// set empty; no value of LOG_USE_SYSLOG is a config problem.
func TestLogsToJournal(t *testing.T) {
	for _, tc := range []struct {
		cfg     string
		journal bool
	}{
		{"LOG_FILE_NAME=/var/log/fabricmanager.log\n", false},
		{"LOG_FILE_NAME=/var/log/fabricmanager.log\nLOG_USE_SYSLOG=0\n", false},
		{"LOG_FILE_NAME=/var/log/fabricmanager.log\nLOG_USE_SYSLOG=1\n", true},
		{"LOG_FILE_NAME=/var/log/fabricmanager.log\nLOG_USE_SYSLOG=yes\n", true},
		{"LOG_FILE_NAME=/var/log/fabricmanager.log\nLOG_USE_SYSLOG=2\n", true},
		{"LOG_FILE_NAME=\n", true},
		{"", false},
	} {
		c := ParseFMConfig(tc.cfg)
		if got := c.LogsToJournal(); got != tc.journal {
			t.Errorf("%q: LogsToJournal %v, want %v", tc.cfg, got, tc.journal)
		}
		if len(c.Problems) > 0 {
			t.Errorf("%q: problems %v, want none", tc.cfg, c.Problems)
		}
	}
}
