package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestScontrolUpdateAgainstSlurm: scontrol update of a pending (held) job, a running
// one, an ended one and none, with good and bad tags and values, on a real Slurm 22.05
// and on gangrun: the same words on the same stream and the same exit codes, and the
// changes seen by squeue; scontrol requeue of a --no-requeue job refused alike;
// `scontrol hold -- ID`; Restarts after a requeue.
func TestScontrolUpdateAgainstSlurm(t *testing.T) {
	p := startSlurmPair(t, "gpu-a", "gpu-b")
	sides := []side{realSlurm, gangrunSide}
	var dirs, held, run, ended, noRequeue, niced, later [2]string
	for i, s := range sides {
		dirs[i] = sharedDir(t)
		sub := func(args ...string) string {
			out, errOut, code := p.run(s, dirs[i], "", nil, "sbatch", append([]string{"--parsable"}, args...)...)
			if code != 0 {
				t.Fatalf("%s sbatch %v: %d %s", s, args, code, errOut)
			}
			return strings.TrimSpace(out)
		}
		ended[i] = sub("--gres=gpu:1", "--wrap", "true")
		p.waitEnd(s, ended[i], time.Minute)
		held[i] = sub("-H", "--time=30", "--job-name=upd", "--gres=gpu:1", "--wrap", "true")
		later[i] = sub("--begin=now+600", "--gres=gpu:1", "--wrap", "true")
		niced[i] = sub("-H", "--nice=10", "--mail-type=end,FAIL", "--gres=gpu:1", "--wrap", "true")
		run[i] = sub("--gres=gpu:1", "--time=30", "--wrap", "sleep 300")
		noRequeue[i] = sub("--gres=gpu:1", "--no-requeue", "--wrap", "sleep 300")
		for _, id := range []string{run[i], noRequeue[i]} {
			waitFor(t, time.Minute, string(s)+" job running", func() (bool, string) {
				out, errOut, _ := p.run(s, dirs[i], "", nil, "squeue", "-h", "-j", id, "-o", "%T")
				return strings.TrimSpace(out) == "RUNNING", out + errOut
			})
		}
	}
	words := func(i int, out string) string {
		for id, w := range map[string]string{held[i]: "HELD", run[i]: "RUN", ended[i]: "ENDED", noRequeue[i]: "NOREQ", niced[i]: "NICED", later[i]: "LATER"} {
			out = regexp.MustCompile(`\b`+id+`\b`).ReplaceAllString(out, w)
		}
		return out
	}
	ids := func(i int, a string) string {
		return strings.NewReplacer("HELD", held[i], "RUN", run[i], "ENDED", ended[i], "NOREQ", noRequeue[i], "NICED", niced[i], "LATER", later[i]).Replace(a)
	}
	agree, total := 0, 0
	compare := func(name string, args ...string) {
		t.Helper()
		var outs, errs [2]string
		var codes [2]int
		for i, s := range sides {
			own := make([]string, len(args))
			for k, a := range args {
				own[k] = ids(i, a)
			}
			out, errOut, code := p.run(s, dirs[i], "", nil, name, own...)
			outs[i], errs[i], codes[i] = words(i, out), words(i, errOut), code
		}
		total++
		if outs != [2]string{outs[0], outs[0]} || errs[0] != errs[1] || codes[0] != codes[1] {
			t.Errorf("%s %q:\nslurm (exit %d):\n%s%s\ngangrun (exit %d):\n%s%s", name, args, codes[0], outs[0], errs[0], codes[1], outs[1], errs[1])
			return
		}
		agree++
	}
	show := []string{"squeue", "-h", "-j", "HELD", "-o", "%j %l %T %r"}
	compare("scontrol", "update", "JobId=HELD", "TimeLimit=20", "JobName=renamed")
	compare(show[0], show[1:]...)
	compare("scontrol", "update", "jobid=HELD", "timel=+5")
	compare(show[0], show[1:]...)
	compare("scontrol", "update", "JobId=HELD", "TimeLimit=-10")
	compare(show[0], show[1:]...)
	compare("scontrol", "update", "JobId", "HELD", "Name", "again")
	compare(show[0], show[1:]...)
	compare("squeue", "-h", "-j", "NICED", "-o", "%y")
	// --mail-type and --mail-user: kept and shown; no mail is sent.
	var mails [2]map[string]string
	for i, s := range sides {
		out, _, _ := p.run(s, dirs[i], "", nil, "scontrol", "show", "job", niced[i])
		f := scontrolFields(out)
		mails[i] = map[string]string{"MailUser": f["MailUser"], "MailType": f["MailType"]}
	}
	total++
	if mails[0]["MailType"] == "" || fmt.Sprint(mails[0]) != fmt.Sprint(mails[1]) {
		t.Errorf("scontrol show job's mail fields: slurm %v, gangrun %v", mails[0], mails[1])
	} else {
		agree++
	}
	compare("sbatch", "--mail-type=bogus", "--gres=gpu:1", "--wrap", "true")
	compare("sbatch", "--nice=3000000000", "--gres=gpu:1", "--wrap", "true")
	compare("scontrol", "update", "JobId=HELD", "Nice=50")
	compare("squeue", "-h", "-j", "HELD", "-o", "%y")
	compare("scontrol", "update", "JobId=HELD", "Nice")
	compare("squeue", "-h", "-j", "HELD", "-o", "%y")
	compare("scontrol", "update", "JobId=HELD", "Nice=3000000000")
	compare("scontrol", "update", "JobId=HELD", "Foo=1")
	compare("scontrol", "update", "JobId=HELD", "TimeLimit=abc")
	compare("scontrol", "update", "JobId=HELD", "Priority=abc")
	compare("scontrol", "update", "JobId=HELD", "TimeLimit")
	compare("scontrol", "update", "JobId=HELD")
	compare("scontrol", "update", "TimeLimit=5")
	compare("scontrol", "update", "JobId=99999", "TimeLimit=5")
	compare("scontrol", "update", "JobId=HELD", "Partition=nope")
	// A dependency on no job: Slurm takes it ("afterok:99999(unfulfilled)", exit 0);
	// gangrun refuses it, as its sbatch does (docs/slurm.md, what differs).
	for i, s := range sides[1:] {
		out, errOut, code := p.run(s, dirs[i+1], "", nil, "scontrol", "update", "JobId="+held[i+1], "Dependency=afterok:99999")
		if code != 1 || out != "" || words(i+1, errOut) != "Job dependency problem for job HELD\n" {
			t.Errorf("gangrun scontrol update Dependency=afterok:99999: exit %d, %q %q", code, out, errOut)
		}
	}
	compare("scontrol", "update", "JobId=HELD", "Dependency=afterok:ENDED")
	compare("scontrol", "update", "JobId=RUN", "Dependency=afterok:ENDED")
	compare("scontrol", "update", "JobId=RUN", "NumNodes=2")
	compare("scontrol", "update", "JobId=RUN", "JobName=running")
	compare("squeue", "-h", "-j", "RUN", "-o", "%j %T")
	compare("scontrol", "update", "JobId=ENDED", "JobName=x")
	compare("scontrol", "update", "JobId=ENDED", "TimeLimit=5")
	// --begin: PENDING, reason BeginTime, until then; StartTime=now lets it run.
	for i, s := range sides {
		waitFor(t, time.Minute, string(s)+" job pending for its begin time", func() (bool, string) {
			out, errOut, _ := p.run(s, dirs[i], "", nil, "squeue", "-h", "-j", later[i], "-o", "%T %r")
			return strings.TrimSpace(out) == "PENDING BeginTime", out + errOut
		})
	}
	compare("sbatch", "--begin=bogus", "--gres=gpu:1", "--wrap", "true")
	compare("scontrol", "update", "JobId=LATER", "StartTime=bogus")
	compare("scontrol", "update", "JobId=RUN", "StartTime=now+60")
	compare("scontrol", "update", "JobId=LATER", "StartTime=now")
	for i, s := range sides {
		if st := p.waitEnd(s, later[i], time.Minute); st != "COMPLETED" {
			t.Errorf("%s: the job let start by StartTime=now ended %s, want COMPLETED", s, st)
		}
	}
	// Dependencies: '?' (any of), after's +time, --kill-on-invalid-dep.
	var anyOf, timed, never, killed [2]string
	for i, s := range sides {
		sub := func(args ...string) string {
			out, errOut, code := p.run(s, dirs[i], "", nil, "sbatch", append([]string{"--parsable", "--gres=gpu:1"}, args...)...)
			if code != 0 {
				t.Fatalf("%s sbatch %v: %d %s", s, args, code, errOut)
			}
			return strings.TrimSpace(out)
		}
		anyOf[i] = sub("--dependency=afternotok:"+ended[i]+"?afterok:"+ended[i], "--wrap", "true")
		timed[i] = sub("--dependency=after:"+run[i]+"+10", "--wrap", "true")
		never[i] = sub("--dependency=afternotok:"+ended[i], "--wrap", "true")
		killed[i] = sub("--dependency=afternotok:"+ended[i], "--kill-on-invalid-dep=yes", "--wrap", "true")
	}
	for i, s := range sides {
		if st := p.waitEnd(s, anyOf[i], time.Minute); st != "COMPLETED" {
			t.Errorf("%s: the job of afternotok?afterok on a completed job ended %s, want COMPLETED", s, st)
		}
		if st := p.waitEnd(s, killed[i], time.Minute); st != "CANCELLED" {
			t.Errorf("%s: the --kill-on-invalid-dep job ended %s, want CANCELLED", s, st)
		}
		for id, want := range map[string]string{timed[i]: "PENDING Dependency", never[i]: "PENDING DependencyNeverSatisfied"} {
			waitFor(t, time.Minute, string(s)+" dependent job "+want, func() (bool, string) {
				out, errOut, _ := p.run(s, dirs[i], "", nil, "squeue", "-h", "-j", id, "-o", "%T %r")
				return strings.TrimSpace(out) == want, out + errOut
			})
		}
		p.run(s, dirs[i], "", nil, "scancel", timed[i], never[i])
	}
	compare("sbatch", "--kill-on-invalid-dep=maybe", "--gres=gpu:1", "--wrap", "true")
	// An unknown --qos: the test's Slurm keeps no accounting (no slurmdbd), and takes
	// any; one that enforces QOS (AccountingStorageEnforce=qos) says ESLURM_INVALID_QOS's
	// words, as gangrun does with no policy, or one without that QOS.
	if out, errOut, code := p.run(gangrunSide, dirs[1], "", nil, "sbatch", "--qos=bogus", "--gres=gpu:1", "--wrap", "true"); code != 1 || out != "" ||
		errOut != "sbatch: error: Batch job submission failed: Invalid qos specification\n" {
		t.Errorf("gangrun sbatch --qos=bogus: exit %d, %q %q", code, out, errOut)
	}
	// Requeues: refused for a --no-requeue job; counted in Restarts.
	compare("scontrol", "requeue", "NOREQ")
	compare("scontrol", "requeue", "RUN")
	for i, s := range sides {
		waitFor(t, time.Minute, string(s)+" Restarts=1 after scontrol requeue", func() (bool, string) {
			out, errOut, _ := p.run(s, dirs[i], "", nil, "scontrol", "show", "job", run[i])
			return scontrolFields(out)["Restarts"] == "1", out + errOut
		})
	}
	// A running job's time limit: lowered, as Slurm; gangrun's own seconds show it end
	// TIMEOUT soon.
	compare("scontrol", "update", "JobId=NOREQ", "TimeLimit=5")
	compare("squeue", "-h", "-j", "NOREQ", "-o", "%l %T")
	if _, errOut, code := p.run(gangrunSide, dirs[1], "", nil, "scontrol", "update", "JobId="+noRequeue[1], "TimeLimit=3s"); code != 0 {
		t.Errorf("gangrun scontrol update TimeLimit=3s of a running job: exit %d %s", code, errOut)
	} else if st := p.waitEnd(gangrunSide, noRequeue[1], time.Minute); st != "TIMEOUT" {
		t.Errorf("gangrun: the running job whose time limit was lowered to 3s ended %s, want TIMEOUT", st)
	}
	// (Not HELD: Slurm 22.05 releases a held job whose nice is updated.)
	compare("scontrol", "hold", "--", "NICED")
	compare("squeue", "-h", "-j", "NICED", "-o", "%T %r")
	for i, s := range sides {
		for _, id := range []string{held[i], run[i], noRequeue[i], niced[i]} {
			p.run(s, dirs[i], "", nil, "scancel", id)
		}
		for _, id := range []string{held[i], run[i], noRequeue[i], niced[i]} {
			p.waitEnd(s, id, time.Minute)
		}
	}
	t.Logf("scontrol update: %d of %d outputs agree", agree, total)
}

// TestScontrolUpdateQuotesBadID: scontrol update of a job id with control bytes and an
// escape sequence says Slurm's words with the id quoted, so nothing reaches the
// terminal raw; exit 1.
func TestScontrolUpdateQuotesBadID(t *testing.T) {
	links := slurmLinks(t)
	p := &slurmPair{t: t, gr: startJobCluster(t, "gpu-a"), links: links}
	dir := sharedDir(t)
	out, errOut, code := p.run(gangrunSide, dir, "", nil, "scontrol", "update", "JobId=9\x01\x1b[31m", "Nice=5")
	if want := "Invalid job id specified for job \"9\\x01\\x1b[31m\"\n"; code != 1 || out != "" || errOut != want {
		t.Errorf("scontrol update JobId=9\\x01\\x1b[31m: exit %d %q %q, want 1 and %q", code, out, errOut, want)
	}
}
