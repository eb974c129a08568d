package launcher

import "testing"

func TestParseStd(t *testing.T) {
	for _, c := range []struct {
		in      string
		ok      bool
		r0, r1  Std
		nothing bool
	}{
		{"0", true, StdNone, StdNone, true}, {"3", true, StdAll, StdAll, false},
		{"0:1,1:2", true, StdOut, StdErr, false}, {"1:3", true, StdNone, StdAll, false},
		{"4", false, 0, 0, false}, {"-1", false, 0, 0, false}, {"0:4", false, 0, 0, false},
		{"a", false, 0, 0, false}, {"0:1,", false, 0, 0, false}, {"", false, 0, 0, false},
	} {
		s, err := ParseStd(c.in)
		if (err == nil) != c.ok {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if c.ok && (s.For(0) != c.r0 || s.For(1) != c.r1 || s.IsZero() != c.nothing) {
			t.Errorf("%q: rank 0 %d, rank 1 %d, zero %v", c.in, s.For(0), s.For(1), s.IsZero())
		}
	}
}

// TestStreamsRoute: torchrun's rules: a redirected stream goes to its file only, a
// tee'd one to its file and the console, any other to the console only; the filter
// keeps ranks off the console, never out of the files.
func TestStreamsRoute(t *testing.T) {
	red, _ := ParseStd("0:1")
	tee, _ := ParseStd("1:2,2:3")
	s := &Streams{Redirects: red, Tee: tee, Filter: []int{0, 2}}
	for _, c := range []struct {
		rank          int
		file, console [2]bool
	}{
		{0, [2]bool{true, false}, [2]bool{false, true}},
		{1, [2]bool{false, true}, [2]bool{false, false}}, // filtered off the console
		{2, [2]bool{true, true}, [2]bool{true, true}},
		{3, [2]bool{false, false}, [2]bool{false, false}},
	} {
		file, console := s.route(c.rank)
		if file != c.file || console != c.console {
			t.Errorf("local rank %d: file %v console %v, want %v %v", c.rank, file, console, c.file, c.console)
		}
	}
	if p := s.prefix("trainer", 1, 5); p != "" {
		t.Errorf("no template: prefix %q", p)
	}
	s.PrefixTemplate = "[${role_name}${local_rank}/${rank}]:"
	if p := s.prefix("trainer", 1, 5); p != "[trainer1/5]:" {
		t.Errorf("prefix %q", p)
	}
}

func FuzzParseStd(f *testing.F) {
	for _, s := range []string{"0", "3", "0:1,1:2", "9:0", ",", "1:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sp, err := ParseStd(s)
		if err == nil {
			for r := range 4 {
				if sp.For(r) > StdAll {
					t.Fatalf("%q: rank %d gets %d", s, r, sp.For(r))
				}
			}
		}
	})
}
