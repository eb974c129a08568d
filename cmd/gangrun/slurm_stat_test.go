package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gangrun/gangrun/internal/slurmtest"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/job"
	"github.com/gangrun/gangrun/policy"
	"github.com/gangrun/gangrun/slurm"
)

// slurmLinks makes a directory of links named after Slurm's commands to the gangrun
// binary, for the test.
func slurmLinks(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range slurm.Names() {
		if err := os.Symlink(gangrunBin, filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// slurmCmd runs gangrun as Slurm's command name (a link in links) against c, in the
// test's directory, and returns its stdout, stderr and exit code.
func (c *jobCluster) slurmCmd(links, name string, args ...string) (string, string, int) {
	c.t.Helper()
	return (&slurmPair{t: c.t, gr: c, links: links}).run(gangrunSide, "", "", nil, name, args...)
}

// TestSprioAndSshareShowTheScheduler: with the fair-share weight set and a recorded
// usage that makes heavy's account over-served, sprio gives light's pending job
// (submitted after heavy's) the higher priority, with the factors the scheduler uses
// (fair-share 10000 for light, 625 for heavy: 2^-4 of 10000), and light's is the job
// that starts when the GPUs come free; sshare shows the tree with the same factors, and, once the
// blocking job's GPU-seconds are recorded, its account's usage.
func TestSprioAndSshareShowTheScheduler(t *testing.T) {
	c := startJobCluster(t, "gpu-a", "gpu-b")
	unixUsers(t, "heavy", "light")
	t.Chdir(sharedDir(t))
	links := slurmLinks(t)
	s, err := store.NewConsul(c.consul)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	u, _ := json.Marshal(policy.Usage{Updated: time.Now().UTC(), Accounts: map[string]float64{"hpc": 3.6e6}, Users: map[string]float64{"hpc/heavy": 3.6e6}})
	if _, err := s.Txn(context.Background(), []store.Op{{Verb: store.Set, Key: policy.UsageKey, Value: u}}); err != nil {
		t.Fatal(err)
	}
	c.setPolicy(`{"priority": {"weights": {"fairshare": 10000}},
		"accounts": {"hpc": {"users": {"heavy": {}}}, "lab": {"shares": 2, "users": {"light": {}}}, "ops": {}}}`)
	// sshare before any job runs: the tree and the factors the scheduler ranks with
	// (the usage decays meanwhile: its shares of the whole stay).
	out, _, code := c.slurmCmd(links, "sshare", "-a", "-P", "-o", "Account,User,RawShares,NormShares,RawUsage,EffectvUsage,FairShare")
	for _, line := range []string{
		regexp.QuoteMeta("Account|User|RawShares|NormShares|RawUsage|EffectvUsage|FairShare"),
		` hpc\|\|1\|0.250000\|3[56]\d\d\d\d\d\|1.000000\|0.062500`,
		`  hpc\|heavy\|1\|0.250000\|3[56]\d\d\d\d\d\|1.000000\|0.062500`,
		` lab\|\|2\|0.500000\|0\|0.000000\|1.000000`,
		`  lab\|light\|1\|0.500000\|0\|0.000000\|1.000000`,
		` ops\|\|1\|0.250000\|0\|0.000000\|1.000000`,
	} {
		if code != 0 || !regexp.MustCompile(`(?m)^`+line+`$`).MatchString(out) {
			t.Errorf("sshare -a -P: exit %d, no line %q in\n%s", code, line, out)
		}
	}
	blocker := c.submit("--uid", "root", "--account", "ops", "--nodes", "2", "--gpus-per-node", "8", "--", "sleep", "300")
	c.waitState(blocker, job.Running, 60*time.Second)
	t.Cleanup(func() { c.gangrun("cancel", blocker) })
	heavy := c.submit("--uid", "heavy", "--nodes", "2", "--gpus-per-node", "8", "--", "sleep", "300")
	light := c.submit("--uid", "light", "--nodes", "2", "--gpus-per-node", "8", "--", "sleep", "300")
	t.Cleanup(func() { c.gangrun("cancel", heavy); c.gangrun("cancel", light) })

	out, errOut, code := c.slurmCmd(links, "sprio")
	// By job id, as sprio sorts them: heavy's first, with the lower priority.
	want := "          JOBID PARTITION   PRIORITY       SITE  FAIRSHARE\n" +
		pad15(heavy) + " " + "gangrun  " + "        625          0        625\n" +
		pad15(light) + " " + "gangrun  " + "      10000          0      10000\n"
	if code != 0 || errOut != "" || out != want {
		t.Errorf("sprio: exit %d %s\n%s\nwant:\n%s", code, errOut, out, want)
	}
	out, _, _ = c.slurmCmd(links, "sprio", "-w")
	if want := "          JOBID PARTITION   PRIORITY       SITE  FAIRSHARE\n        Weights                               1      10000\n"; out != want {
		t.Errorf("sprio -w:\n%q\nwant\n%q", out, want)
	}
	out, _, _ = c.slurmCmd(links, "sprio", "-h", "-u", "heavy", "-o", "%i %u %f")
	if want := heavy + " heavy 0.0625000\n"; out != want {
		t.Errorf("sprio -u heavy: %q, want %q", out, want)
	}
	// A nice is NICE's, taken off PRIORITY (never below 1), not SITE's.
	for _, tc := range []struct{ nice, want string }{{"10", "615 0 10\n"}, {"1000", "1 0 1000\n"}} {
		// Until the cluster has accepted the job, an update is "try again".
		deadline := time.Now().Add(30 * time.Second)
		_, errOut, code := c.slurmCmd(links, "scontrol", "update", "JobId="+heavy, "Nice="+tc.nice)
		for ; code != 0 && strings.Contains(errOut, "try again") && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			_, errOut, code = c.slurmCmd(links, "scontrol", "update", "JobId="+heavy, "Nice="+tc.nice)
		}
		if code != 0 {
			t.Fatalf("scontrol update Nice=%s: exit %d %s", tc.nice, code, errOut)
		}
		// The job's request is placed again with its new nice (a moment unlisted).
		for out, _, _ = c.slurmCmd(links, "sprio", "-h", "-j", heavy, "-o", "%Y %S %N"); out != tc.want && time.Now().Before(deadline); {
			time.Sleep(200 * time.Millisecond)
			out, _, _ = c.slurmCmd(links, "sprio", "-h", "-j", heavy, "-o", "%Y %S %N")
		}
		if out != tc.want {
			t.Errorf("sprio with nice %s: %q, want %q", tc.nice, out, tc.want)
		}
	}
	out, _, code = c.slurmCmd(links, "sprio", "-j", "99999")
	if code != 0 || !strings.HasSuffix(out, "Unable to find jobs matching user/id(s) specified\n") {
		t.Errorf("sprio -j 99999: exit %d %q", code, out)
	}
	// The blocker's GPU-seconds reach the usage record (the scheduler writes it every
	// allocator.UsageFlushInterval): sshare shows account ops with usage. (sprio ran
	// first: within a minute of it, ops's usage leaves heavy's factor at 625.)
	waitFor(t, 2*time.Minute, "sshare showing account ops's recorded usage", func() (bool, string) {
		out, errOut, _ := c.slurmCmd(links, "sshare", "-n", "-P", "-A", "ops", "-o", "Account,RawUsage")
		first, _, _ := strings.Cut(out, "\n") // the account's line; root's own follows
		raw, _ := strconv.Atoi(strings.TrimPrefix(first, " ops|"))
		return raw > 0, out + errOut
	})
	c.gangrun("cancel", blocker)
	c.waitState(light, job.Running, 90*time.Second)
	if m := c.show(heavy); m["state"] != string(job.Pending) {
		t.Errorf("heavy's job: %v, want PENDING behind light's, as sprio ranked them", m["state"])
	}
	for _, id := range []string{heavy, light} {
		c.gangrun("cancel", id)
	}
	c.waitState(light, job.Cancelled, 60*time.Second)
}

// TestStatCommandsAgainstSlurm: with a real Slurm (priority/multifactor, the Linux
// task accounting) and gangrun given the same weights, the same jobs on both (one
// running an srun step whose task holds 100 MiB, one pending behind it): sstat's,
// sprio's and sshare's headers, widths and parsable forms, their errors and exit
// codes print the same; sstat's MaxRSS is at least the 100 MiB on both sides.
func TestStatCommandsAgainstSlurm(t *testing.T) {
	p := startSlurmPairWith(t, slurmtest.Options{Extra: []string{"PriorityType=priority/multifactor", "PriorityWeightFairshare=10000",
		"PriorityWeightJobSize=500", "JobAcctGatherType=jobacct_gather/linux", "JobAcctGatherFrequency=task=1"}}, "gpu-a", "gpu-b")
	p.gr.setPolicy(`{"priority": {"weights": {"fairshare": 10000, "job_size": 500}}}`)
	script := "#!/bin/bash\n#SBATCH --nodes=2 --gres=gpu:8 --ntasks-per-node=1\n" +
		"srun python3 -c 'import time; b = b\"x\" * (100 << 20); time.sleep(300)'\n"
	sides := []side{realSlurm, gangrunSide}
	var dirs, runs, pends, pends2 [2]string
	for i, s := range sides {
		dirs[i] = sharedDir(t)
		if err := os.WriteFile(filepath.Join(dirs[i], "run.sh"), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		out, errOut, code := p.run(s, dirs[i], "", nil, "sbatch", "--parsable", "run.sh")
		if code != 0 {
			t.Fatalf("%s sbatch: %d %s", s, code, errOut)
		}
		runs[i] = strings.TrimSpace(out)
		waitFor(t, time.Minute, string(s)+" job running with its step", func() (bool, string) {
			out, errOut, _ := p.run(s, dirs[i], "", nil, "squeue", "-h", "-s", "-o", "%i")
			return strings.Contains(out, runs[i]+".0"), out + errOut
		})
		out, errOut, code = p.run(s, dirs[i], "", nil, "sbatch", "--parsable", "--nodes=1", "--gres=gpu:8", "--wrap", "sleep 300")
		if code != 0 {
			t.Fatalf("%s sbatch: %d %s", s, code, errOut)
		}
		pends[i] = strings.TrimSpace(out)
		out, errOut, code = p.run(s, dirs[i], "", nil, "sbatch", "--parsable", "--nodes=2", "--gres=gpu:8", "--wrap", "true")
		if code != 0 {
			t.Fatalf("%s sbatch: %d %s", s, code, errOut)
		}
		pends2[i] = strings.TrimSpace(out)
		t.Cleanup(func() {
			p.run(s, dirs[i], "", nil, "scancel", runs[i], pends[i], pends2[i])
		})
	}
	// MaxRSS: at least the task's 100 MiB, on both sides, once sampled.
	for i, s := range sides {
		waitFor(t, time.Minute, string(s)+" sstat's MaxRSS of the step", func() (bool, string) {
			out, errOut, _ := p.run(s, dirs[i], "", nil, "sstat", "-n", "-P", "-j", runs[i]+".0", "-o", "MaxRSS,MaxRSSNode,AveCPU")
			f := strings.Split(strings.TrimSpace(out), "|")
			return len(f) == 3 && maxRSS(f[0]) >= 100<<20 && (f[1] == "gpu-a" || f[1] == "gpu-b"), out + errOut
		})
	}
	// The values' forms (115824K or 100M, 00:00:00, 0), the step's own fields and the
	// nodes'.
	var shapes [2]string
	for i, s := range sides {
		out, errOut, _ := p.run(s, dirs[i], "", nil, "sstat", "-n", "-P", "-j", runs[i]+".0", "-o",
			"JobID,MaxRSS,AveRSS,AveCPU,MinCPU,MaxPages,AvePages,NTasks,MaxRSSNode,MinCPUNode")
		shape := regexp.MustCompile(`gpu-[ab]`).ReplaceAllString(strings.ReplaceAll(out, runs[i], "RUN"), "NODE")
		shapes[i] = regexp.MustCompile(`[0-9]+[KMGT]?`).ReplaceAllString(shape, "N") + errOut
	}
	if shapes[0] != shapes[1] {
		t.Errorf("sstat's values take other forms:\nslurm:   %q\ngangrun: %q", shapes[0], shapes[1])
	}
	ids := func(i int, a string) string {
		return strings.NewReplacer("RUN", runs[i], "PEND2", pends2[i], "PEND", pends[i]).Replace(a)
	}
	norm := func(i int, out string) string {
		out = strings.ReplaceAll(out, runs[i], "RUN")
		out = strings.ReplaceAll(out, pends2[i], "PEND2")
		return strings.ReplaceAll(out, pends[i], "PEND")
	}
	// compare runs a command on both sides; keep picks the lines compared (nil: all).
	compare := func(keep func(string) string, name string, args ...string) {
		t.Helper()
		var outs [2]string
		var codes [2]int
		for i, s := range sides {
			own := make([]string, len(args))
			for k, a := range args {
				own[k] = ids(i, a)
			}
			out, errOut, code := p.run(s, dirs[i], "", nil, name, own...)
			outs[i], codes[i] = norm(i, out)+"\x00"+norm(i, errOut), code
			if keep != nil {
				outs[i] = keep(outs[i])
			}
		}
		if outs[0] != outs[1] || codes[0] != codes[1] {
			t.Errorf("%s %q:\nslurm (exit %d):\n%q\ngangrun (exit %d):\n%q", name, args, codes[0], outs[0], codes[1], outs[1])
		}
	}
	header := func(n int) func(string) string {
		return func(s string) string {
			lines := strings.Split(s, "\n")
			return strings.Join(lines[:min(n, len(lines))], "\n")
		}
	}
	compare(header(2), "sstat", "-j", "RUN.0")
	compare(header(1), "sstat", "-P", "-j", "RUN.0")
	compare(nil, "sstat", "-n", "-P", "-j", "RUN.0", "-o", "JobID,NTasks,Nodelist")
	compare(nil, "sstat", "-n", "-p", "-j", "RUN", "-o", "JobID,NTasks")
	compare(nil, "sstat", "-a", "-n", "-P", "-j", "RUN", "-o", "JobID,NTasks,Nodelist")
	compare(nil, "sstat", "-n", "-P", "-j", "RUN.batch", "-o", "JobID,NTasks,Nodelist")
	compare(nil, "sstat", "-j", "RUN.7", "-n", "-o", "JobID")
	compare(nil, "sstat", "-j", "PEND", "-o", "JobID")
	compare(nil, "sstat", "-j", "99999", "-o", "JobID")
	compare(nil, "sstat")
	compare(nil, "sstat", "--foo")
	compare(nil, "sstat", "-j", "RUN", "-o", "Bogus")
	compare(nil, "sstat", "-e")
	compare(nil, "sstat", "-j", "abc")
	compare(nil, "sstat", "-j", "RUN.x", "-n")
	compare(nil, "sstat", "-n", "-P", "-o", "JobID", "RUN.0")
	compare(nil, "sprio", "-o", "%Z")
	compare(nil, "sprio", "extra")
	compare(nil, "sprio", "-w")
	compare(header(1), "sprio")
	compare(header(1), "sprio", "-l")
	compare(header(1), "sprio", "-n")
	compare(header(1), "sprio", "-u", "root")
	compare(nil, "sprio", "-h", "-o", "%i %r %u %S %N")
	// By job id, as sprio sorts (the job size factors differ: gangrun's counts GPUs).
	compare(nil, "sprio", "-h", "-o", "%i")
	compare(nil, "sprio", "-j", "99999")
	compare(nil, "sprio", "--foo")
	// No association on Slurm's side (no accounting database): its header alone.
	// gangrun's tree grows the job's account once the scheduler records its usage.
	compare(header(2), "sshare")
	compare(header(2), "sshare", "-l")
	compare(header(1), "sshare", "-P", "-a")
	compare(nil, "sshare", "-o", "Bogus")
	compare(nil, "sshare", "--foo")
	compare(nil, "sshare", "extra")
	// A batch job with no srun step: the batch step alone runs.
	for i, s := range sides {
		p.run(s, dirs[i], "", nil, "scancel", runs[i])
		waitFor(t, time.Minute, string(s)+" the batch-only job running", func() (bool, string) {
			out, errOut, _ := p.run(s, dirs[i], "", nil, "squeue", "-h", "-j", pends[i], "-o", "%T")
			return strings.TrimSpace(out) == "RUNNING", out + errOut
		})
	}
	// The cancelled job's usage records went with its steps.
	st, err := store.NewConsul(p.gr.consul)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	waitFor(t, time.Minute, "the ended job's usage records gone", func() (bool, string) {
		es, _, err := st.List(context.Background(), "gangrun/batch/usage/"+runs[1]+"/")
		return err == nil && len(es) == 0, fmt.Sprint(len(es), err)
	})
	compare(nil, "sstat", "-n", "-P", "-j", "PEND", "-o", "JobID,NTasks")
	compare(nil, "sstat", "-a", "-n", "-P", "-j", "PEND", "-o", "JobID,NTasks")
	compare(nil, "sstat", "-n", "-P", "-j", "PEND.batch", "-o", "JobID,NTasks")
}

// pad15 right-justifies a job id in sprio's JOBID column (%.15i).
func pad15(id string) string { return strings.Repeat(" ", max(15-len(id), 0)) + id }

// maxRSS reads a MaxRSS value as sstat writes it (115824K, 100M; convert_num_unit's
// 1.50K form too) into bytes; -1 when it is no such value.
func maxRSS(s string) float64 {
	m := regexp.MustCompile(`^([0-9]+(?:\.[0-9][0-9])?)([KMGT]?)$`).FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	if m[2] != "" {
		for range strings.Index("KMGT", m[2]) + 1 {
			v *= 1024
		}
	}
	return v
}
