package launcher

import "testing"

// TestBeneath: a checkpoint to resume from is taken only from inside the job's own
// checkpoint directory, however the path is spelled.
func TestBeneath(t *testing.T) {
	for _, tc := range []struct {
		dir, path string
		want      bool
	}{
		{"/ckpt", "/ckpt/step-100", true},
		{"/ckpt/", "/ckpt/run/step-100", true},
		{"/ckpt", "/ckpt/../home/mallory/evil", false},
		{"/ckpt", "/ckpt", false},
		{"/ckpt", "/ckptx/step-1", false},
		{"/ckpt", "/home/mallory/ckpt", false},
		{"", "/ckpt/step-1", false},
	} {
		if got := beneath(tc.dir, tc.path); got != tc.want {
			t.Errorf("beneath(%q, %q) = %v, want %v", tc.dir, tc.path, got, tc.want)
		}
	}
}
