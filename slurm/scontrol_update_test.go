package slurm

import (
	"bytes"
	"slices"
	"testing"
	"time"
)

// TestParseUpdate: scontrol update's arguments as scontrol 22.05 reads them (tags any
// case, abbreviated down to Slurm's least length, TAG VALUE pairs too), and its words
// and exit code for each kind of bad argument; a tag Slurm knows that gangrun does not
// change is refused in one line.
func TestParseUpdate(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		errText string
		check   func(ju jobUpdate) bool
	}{
		{[]string{"JobId=5", "TimeLimit=10"}, "", func(ju jobUpdate) bool { return ju.ids == "5" && *ju.u.TimeLimit == 10*time.Minute }},
		{[]string{"jobid=5", "timel=1-00:00:00", "na=x"}, "", func(ju jobUpdate) bool {
			return *ju.u.TimeLimit == 24*time.Hour && *ju.u.Name == "x"
		}},
		{[]string{"JobId", "5", "NumNodes=2-3", "Partition=gpu", "Dependency=afterok:4", "Priority=7"}, "", func(ju jobUpdate) bool {
			return *ju.u.MinNodes == 2 && *ju.u.MaxNodes == 3 && *ju.u.Partition == "gpu" && *ju.u.Dependency == "afterok:4" && *ju.u.Priority == 7
		}},
		{[]string{"JobId=5", "TimeLimit=+30"}, "", func(ju jobUpdate) bool { return ju.timeStep == 1 && *ju.u.TimeLimit == 30*time.Minute }},
		{[]string{"JobId=5", "TimeLimit=-1"}, "", func(ju jobUpdate) bool { return ju.timeStep == -1 && *ju.u.TimeLimit == time.Minute }},
		{[]string{"JobId=5", "TimeLimit=UNLIMITED"}, "", func(ju jobUpdate) bool { return ju.timeStep == 0 && *ju.u.TimeLimit == 0 }},
		{[]string{"JobId=5", "TimeLimit=abc"}, "scontrol: error: Invalid TimeLimit value\n", nil},
		{[]string{"TimeLimit=+5", "JobId=5"}, "scontrol: error: JobId must precede TimeLimit increment or decrement\n", nil},
		{[]string{"JobId=5", "Priority=-3"}, "scontrol: error: Invalid Priority value: -3\n", nil},
		{[]string{"JobId=5", "Foo=1"}, "Update of this parameter is not supported: Foo=1\nRequest aborted\n", nil},
		{[]string{"JobId=5", "Ti=1"}, "Update of this parameter is not supported: Ti=1\nRequest aborted\n", nil},
		{[]string{"JobId=5", "StartTime=bogus"}, "Invalid time specification (pos=0): bogus\nNo changes specified\n", nil},
		{[]string{"JobId=5", "StartTime=now+1hour"}, "", func(ju jobUpdate) bool { return time.Until(*ju.u.Begin) > 59*time.Minute }},
		{[]string{"JobId=5", "Nice"}, "", func(ju jobUpdate) bool { return *ju.u.Nice == 100 }},
		{[]string{"JobId=5", "nice=-7"}, "", func(ju jobUpdate) bool { return *ju.u.Nice == -7 }},
		{[]string{"JobId=5", "Nice=abc"}, "", func(ju jobUpdate) bool { return *ju.u.Nice == 0 }},
		{[]string{"JobId=5", "Nice=3000000000"}, "scontrol: error: Nice value out of range (+/- 2147483645). Value ignored\n", nil},
		{[]string{"JobId=5", "QOS=high"}, "scontrol: error: scontrol update QOS is " + notBuilt + "\n", nil},
		{[]string{"JobId=5", "TimeLimit"}, "Invalid input: TimeLimit\nRequest aborted\n", nil},
		{[]string{"JobId=5"}, "No changes specified\n", nil},
		{[]string{"TimeLimit=5"}, "No valid entity in update command\nInput line must include \"NodeName\", \"PartitionName\", \"Reservation\", \"JobId\", or \"SlurmctldDebug\"\n", nil},
		{[]string{"NodeName=a", "State=DRAIN"}, "scontrol: error: scontrol update NodeName is " + notBuilt + "\n", nil},
	} {
		var errOut bytes.Buffer
		ju, code, done := parseUpdate(&Env{Stderr: &errOut}, tc.args)
		switch {
		case tc.errText != "" && (!done || code != 1 || errOut.String() != tc.errText):
			t.Errorf("update %q: done %v, exit %d, %q; want exit 1 and %q", tc.args, done, code, errOut.String(), tc.errText)
		case tc.errText == "" && (done || !tc.check(ju)):
			t.Errorf("update %q: done %v, %q, read as %+v", tc.args, done, errOut.String(), ju)
		}
	}
}

// TestScontrolDoubleDash: scontrol's getopt_long permutes, so "--" after the verb ends
// the options and goes: "scontrol hold -- 5" holds job 5.
func TestScontrolDoubleDash(t *testing.T) {
	var out bytes.Buffer
	c, _, done := scontrolParse(&Env{Stdout: &out, Stderr: &out}, []string{"hold", "--", "5"})
	if done || c.hold != "hold" || !slices.Equal(c.jobs, []string{"5"}) {
		t.Errorf("scontrol hold -- 5: done %v, %q %q (%s)", done, c.hold, c.jobs, out.String())
	}
	c, _, done = scontrolParse(&Env{Stdout: &out, Stderr: &out}, []string{"--", "release", "5"})
	if done || c.hold != "release" || !slices.Equal(c.jobs, []string{"5"}) {
		t.Errorf("scontrol -- release 5: done %v, %q %q (%s)", done, c.hold, c.jobs, out.String())
	}
}
