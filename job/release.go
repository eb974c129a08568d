package job

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/store"
)

// An allocation job (salloc's: Batch.Allocation) ends when its allocating command
// releases it: salloc writes a Release under gangrun/batch/jobs/<id>/release, sealed
// with its user's MUNGE credential, and the job's step on its first node checks it
// against the job's attested user and records the job's end, as the batch host
// records a batch script's.

// releaseKey is job id's release.
func releaseKey(id string) string { return jobsPrefix + id + "/release" }

// Release is an allocation's end as its allocating command says it: the exit code of
// the command it ran (salloc's own exit code).
type Release struct {
	Job      string    `json:"job"`
	UID      uint32    `json:"uid"`
	ExitCode int       `json:"exit_code"`
	At       time.Time `json:"at"`
}

// storedRelease is a release as written, with its credential.
type storedRelease struct {
	Release    Release `json:"release"`
	Credential string  `json:"credential,omitempty"`
}

// releaseContent is what a release's credential is bound to.
func releaseContent(r Release) []byte {
	b, _ := json.Marshal(r)
	return append([]byte("gangrun release "+r.Job+"\n"), b...)
}

// ReleaseAllocation ends allocation job id with the allocating command's exit code:
// sealer (nil where the cluster checks no credentials) seals it. The job's step on its
// first node records the end (COMPLETED for 0, else FAILED).
func ReleaseAllocation(ctx context.Context, s store.Store, sealer Sealer, id string, uid uint32, code int) error {
	r := Release{Job: id, UID: uid, ExitCode: code, At: time.Now().UTC()}
	st := storedRelease{Release: r}
	if sealer != nil {
		cred, err := sealer.Seal(ctx, releaseContent(r))
		if err != nil {
			return fmt.Errorf("the release's MUNGE credential: %w", err)
		}
		st.Credential = cred
	}
	b, _ := json.Marshal(st)
	_, err := s.Txn(ctx, []store.Op{{Verb: store.Set, Key: releaseKey(id), Value: b}})
	return err
}

// watchRelease waits, on an allocation's first node, for its release and returns its
// exit code; false when ctx ends first. A release whose credential is refused is
// logged and waited past.
func (bs *batchStep) watchRelease(ctx context.Context) (int, bool) {
	id := bs.st.cfg.Job
	w := store.NewWatcher(bs.st.cfg.Store, releaseKey(id))
	for {
		entries, err := w.Next(ctx)
		if err != nil {
			return 0, false
		}
		for _, e := range entries {
			var sr storedRelease
			if e.Key != releaseKey(id) || json.Unmarshal(e.Value, &sr) != nil || sr.Release.Job != id {
				continue
			}
			if p := bs.st.cfg.Prover; p != nil {
				c, err := p.Verify(ctx, sr.Credential, releaseContent(sr.Release), identity.FreshOrReplayed)
				if err != nil || c.UID != sr.Release.UID || (c.UID != bs.stepUID() && c.UID != 0) {
					bs.log.Warn("a release of the allocation is refused", zap.String("uid", strconv.Itoa(int(c.UID))), zap.Error(err))
					continue
				}
			}
			return sr.Release.ExitCode, true
		}
	}
}
