package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/internal/slurmtest"
)

// hostlistEdgeCases are expressions at the grammar's edges, for the comparison with
// scontrol: paddings, prefixes ending in digits, several groups, duplicates, text
// after a bracket, numbers past 2^64, ranges past Slurm's 65,536, malformed ones.
var hostlistEdgeCases = []string{
	"n0[1-3]", "n0[1-3],n04", "n[01-03]", "n01,n02,n03", "n[8-10]", "n[08-10]", "n[008-10]", "n[8-010]",
	"n9,n10", "n09,n10", "n009,n10", "n[9-10],n11", "n[09],n10", "n[1,1-2]", "n[3,1-2],n3", "n1,n1,n2",
	"rack[1-2]-node[01-02]", "a[1-2]b[3-4]c[5-6]", "a[1-2]b[3-4]c[5-6]d[7-8]", "x[0-1]y0[1-2]", "linux[1,2]",
	"a,b[1-2]", "a1g[0010,0011],b0005,c0007", "node[001-003,010]", "n7", "7", "07", "0", "n0", "n00", "n[0]",
	"n[00-02]", "n[0-0]", "login", "login,n1", "n[1-2]-ib", "gpu[1-2]-ib,gpu3-ib", "n[1-2]x", "n18446744073709551615",
	"n18446744073709551616", "n[18446744073709551614-18446744073709551615]", "n[18446744073709551616]", "n[1-70000]",
	"n[1-65536]", "n[10-1]", "n[1-2", "n1]", "n[]", "n[1[2]]", "a[1-10:2]", "n[-1]", "n[a]", "n1 n2", "n1,,n2",
	",n1,", "n[1-3]n[4-6]", "h[1-3],h[4-6]", "h[1-3],g[4-6],h[7-8]", "a.b[1-2]", "x_y[01-02],x_y03", "n99,n100,n101",
	"n[099-101]", "n[99-101]", "n[0099-0101]", "a1b[1-2]", "a1b1,a1b2", "a[1-3],b1,a4", "n[5,3,1]", "n[1-2,3-4]",
	"n[1-3,2-4]", "n[001,002,010-011]", "rack1-n[1-2],rack1-n3,rack2-n[1-2]",
}

// hostlistDifferences are the expressions both accept whose hosts differ, each with
// why (docs/hostlist.md, "Differences from Slurm"); the test checks they still do.
var hostlistDifferences = map[string]string{
	// Slurm reads the number with strtoul, which stops at ULONG_MAX: the host becomes
	// n18446744073709551615. gangrun keeps the name as written: a name, not a number.
	"n18446744073709551616": "a number past 2^64-1 in a host name",
}

// hostlistPrefixes are the prefixes generated expressions draw from.
var hostlistPrefixes = []string{"n", "node", "gpu-", "n0", "rack1-node", "a.b", "x_y", "h1g", "c"}

// randomHostlist is a generated expression: one to three patterns, each a plain host
// name or a prefix with one or two bracket groups of one to three ranges, paddings of
// zero to three zeros, ranges of up to 20, in order or not.
func randomHostlist(r *rand.Rand) string {
	num := func() string {
		n := r.IntN(120)
		return fmt.Sprintf("%0*d", r.IntN(4)+len(fmt.Sprint(n)), n)
	}
	group := func() string {
		var ranges []string
		for i := 0; i < 1+r.IntN(3); i++ {
			lo := num()
			if r.IntN(3) == 0 {
				ranges = append(ranges, lo)
				continue
			}
			var n int
			fmt.Sscan(strings.TrimLeft(lo, "0")+"0", &n)
			ranges = append(ranges, fmt.Sprintf("%s-%d", lo, n/10+r.IntN(20)))
		}
		return "[" + strings.Join(ranges, ",") + "]"
	}
	var pats []string
	for i := 0; i < 1+r.IntN(3); i++ {
		p := hostlistPrefixes[r.IntN(len(hostlistPrefixes))]
		switch r.IntN(4) {
		case 0:
			pats = append(pats, p+num())
		case 1:
			pats = append(pats, p+group()+"-x"+group())
		default:
			pats = append(pats, p+group())
		}
	}
	return strings.Join(pats, ",")
}

// scontrolShow runs `scontrol show WHAT EXPR` with conf and reports what it printed
// and whether it accepted EXPR (exit 0, no error message, no "Invalid hostlist").
func scontrolShow(t *testing.T, conf, what, expr string) (string, bool) {
	t.Helper()
	cmd := exec.Command("scontrol", "show", what, expr)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+conf)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	ok := err == nil && errOut.Len() == 0 && !strings.Contains(out.String(), "Invalid hostlist")
	return out.String(), ok
}

// TestHostlistAgainstScontrol runs generated and edge-case expressions through Slurm
// 22.05's `scontrol show hostnames` and `scontrol show hostlist` and through `gangrun
// hostlist expand` and `compress`: wherever both accept an expression, the hosts, and
// the compressed expression, are the same; compress of the expanded hosts as one list
// also agrees. It logs how many were compared and how many only one side accepted.
func TestHostlistAgainstScontrol(t *testing.T) {
	conf := slurmtest.Conf(t)
	r := rand.New(rand.NewPCG(31, 2205))
	exprs := append([]string{}, hostlistEdgeCases...)
	for len(exprs) < 615 {
		exprs = append(exprs, randomHostlist(r))
	}
	var both, onlySlurm, onlyGangrun, lists int
	for _, expr := range exprs {
		want, slurmOK := scontrolShow(t, conf, "hostnames", expr)
		got := runHostlistCLI(t, nil, nil, "hostlist", "expand", expr)
		switch {
		case slurmOK && got.code == 0:
			both++
			if why, known := hostlistDifferences[expr]; known {
				if got.stdout == want {
					t.Errorf("expand %q: gangrun and scontrol now agree (%q): take it out of hostlistDifferences (%s)", expr, want, why)
				}
				continue
			}
			if got.stdout != want {
				t.Errorf("expand %q: gangrun %q, scontrol %q", expr, got.stdout, want)
				continue
			}
		case slurmOK:
			onlySlurm++
			t.Logf("only scontrol accepts %q: gangrun says %s", expr, strings.TrimSpace(got.stderr))
			continue
		case got.code == 0:
			onlyGangrun++
			t.Logf("only gangrun accepts %q", expr)
			continue
		default:
			continue
		}
		wantC, ok := scontrolShow(t, conf, "hostlist", expr)
		gotC := runHostlistCLI(t, nil, nil, "hostlist", "compress", expr)
		if !ok || gotC.code != 0 || gotC.stdout != wantC {
			t.Errorf("compress %q: gangrun %q (exit %d %s), scontrol %q (accepted %v)", expr, gotC.stdout, gotC.code, gotC.stderr, wantC, ok)
		}
		// The expanded hosts as one comma-separated list of names.
		hosts := strings.Join(strings.Fields(want), ",")
		if len(hosts) > 4000 {
			continue // within the command line's bounds
		}
		lists++
		wantL, ok := scontrolShow(t, conf, "hostlist", hosts)
		gotL := runHostlistCLI(t, nil, nil, append([]string{"hostlist", "compress"}, strings.Fields(want)...)...)
		if !ok || gotL.code != 0 || gotL.stdout != wantL {
			t.Errorf("compress the hosts of %q: gangrun %q (exit %d), scontrol %q (accepted %v)", expr, gotL.stdout, gotL.code, wantL, ok)
		}
	}
	t.Logf("%d expressions: %d accepted by both (expand and compress compared, and compress of %d host lists), %d by scontrol only, %d by gangrun only",
		len(exprs), both, lists, onlySlurm, onlyGangrun)
	if both < 500 {
		t.Errorf("only %d expressions were accepted by both: the generator makes too few valid ones", both)
	}
}

// TestScontrolHostnamesReadsSLURM_NODELIST: 22.05's `scontrol show hostnames` with no
// argument reads SLURM_NODELIST only (docs/hostlist.md): with only SLURM_JOB_NODELIST
// set it says the host list is empty; gangrun reads either, SLURM_JOB_NODELIST first.
func TestScontrolHostnamesReadsSLURM_NODELIST(t *testing.T) {
	conf := slurmtest.Conf(t)
	run := func(vars ...string) (string, string) {
		cmd := exec.Command("scontrol", "show", "hostnames")
		cmd.Env = append(os.Environ(), append([]string{"SLURM_CONF=" + conf}, vars...)...)
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		_ = cmd.Run()
		return out.String(), errOut.String()
	}
	if out, errOut := run("SLURM_JOB_NODELIST=a[1-2]"); out != "" || !strings.Contains(errOut, "host list is empty") {
		t.Errorf("scontrol show hostnames with SLURM_JOB_NODELIST only: %q %q, want nothing and \"host list is empty\"", out, errOut)
	}
	if out, _ := run("SLURM_NODELIST=a[1-2]"); out != "a1\na2\n" {
		t.Errorf("scontrol show hostnames with SLURM_NODELIST: %q, want a1 a2", out)
	}
	for _, vars := range []map[string]string{{"SLURM_JOB_NODELIST": "a[1-2]"}, {"SLURM_NODELIST": "a[1-2]"}} {
		if got := runHostlistCLI(t, vars, nil, "hostlist", "expand"); got.stdout != "a1\na2\n" {
			t.Errorf("gangrun hostlist expand with %v: %q %q", vars, got.stdout, got.stderr)
		}
	}
}
