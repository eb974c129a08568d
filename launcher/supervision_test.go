package launcher

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestPrepareMapsSupervision: Prepare turns each Supervision field's encoding into the
// supervisor's Config once: 0 the default, NoExitCode no code, ColdRestarts no warm
// restarts, a negative WarmDelay none; a record's value out of range is refused.
func TestPrepareMapsSupervision(t *testing.T) {
	h100 := loadInventory(t, "dgx-h100")
	type want struct {
		maxRestarts, exitCode int
		warm                  bool
		warmDelay, hang       time.Duration
		imports               []string
	}
	for _, tc := range []struct {
		name    string
		sup     Supervision
		want    want
		wantErr string
	}{
		{"the defaults", DefaultSupervision(), want{DefaultMaxRestarts, DefaultNoRestartExitCode, true, DefaultWarmDelay, 0, nil}, ""},
		{"zero", Supervision{}, want{0, DefaultNoRestartExitCode, true, DefaultWarmDelay, 0, nil}, ""},
		{"no exit code", Supervision{NoRestartExitCode: NoExitCode}, want{0, 0, true, DefaultWarmDelay, 0, nil}, ""},
		{"an exit code", Supervision{NoRestartExitCode: 7}, want{0, 7, true, DefaultWarmDelay, 0, nil}, ""},
		{"cold restarts", Supervision{ColdRestarts: true}, want{0, DefaultNoRestartExitCode, false, DefaultWarmDelay, 0, nil}, ""},
		{"standbys at once", Supervision{WarmDelay: -1}, want{0, DefaultNoRestartExitCode, true, 0, 0, nil}, ""},
		{"a warm delay", Supervision{WarmDelay: 2 * time.Second}, want{0, DefaultNoRestartExitCode, true, 2 * time.Second, 0, nil}, ""},
		{"set fields", Supervision{MaxRestarts: 5, HangTimeout: time.Minute, WarmImports: []string{"numpy"}},
			want{5, DefaultNoRestartExitCode, true, DefaultWarmDelay, time.Minute, []string{"numpy"}}, ""},
		{"exit code below NoExitCode", Supervision{NoRestartExitCode: -2}, want{}, "--no-restart-exit-code -2: want 1..255, or 0 for none"},
		{"exit code above 255", Supervision{NoRestartExitCode: 256}, want{}, "--no-restart-exit-code 256: want 1..255, or 0 for none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Prepare(context.Background(), Spec{Command: []string{"/bin/true"}, Inventory: h100, NodeName: "a", Supervision: tc.sup})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			c := p.Config
			got := want{c.MaxRestarts, c.NoRestartExitCode, c.WarmRestarts, c.WarmDelay, c.HangTimeout, c.WarmImports}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Config's supervision %+v, want %+v", got, tc.want)
			}
		})
	}
}
