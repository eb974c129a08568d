package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/reason"
	"github.com/gangrun/gangrun/rendezvous"
)

// Who submitted a job, proven (docs/acl.md#identity). With MUNGE (agents' --auth
// munge, the default where munged answers), a job's record carries, under
// gangrun/batch/jobs/<id>/auth, an Auth:
//
//   - the submitter's credential, made by the submitting host's munged and bound to the
//     job's content (jobContent: its id, and its spec as queued) — or, for a job queued
//     through a request box, to the request;
//   - once the elected agent has accepted the job, the uid and gid the job runs as and
//     the agent's own credential (the attestation) bound to the job's content, those
//     ids and the submitter's credential.
//
// The elected agent accepts a pending job once: the submitter's credential must be
// fresh (within munged's time-to-live, 300 s by default), of this cluster's key, bound
// to this very job, never used for another, and made by the job's user or by root
// (sbatch --uid). Otherwise the job ends FAILED with the reason reason.InvalidCredential
// and an audit entry; it never runs. Every step checks the attestation again before
// it starts anything, against the job as it is then, and runs the workers as the
// attested uid and gid, never as a name read from the record alone: this is slurmd
// trusting only slurmctld's launch credential (Slurm's auth/munge and cred/munge).
//
// A credential is used once: accepting it writes gangrun/batch/seen/<digest> (the
// SHA-256 of its text) in the same transaction, and no credential whose digest is
// there is accepted again; the marker goes once the credential has expired.

// authKey is job id's Auth.
func authKey(id string) string { return jobsPrefix + id + "/auth" }

// seenPrefix holds the digests of the credentials accepted (identity.Digest).
const seenPrefix = batchPrefix + "seen/"

// Auth is a job's proof of who submitted it (see above).
type Auth struct {
	// Credential is the submitter's MUNGE credential.
	Credential string `json:"credential,omitempty"`
	// Request is, for a job queued from a request box, the request's key: Credential
	// is bound to the request, which the accepting agent checked.
	Request string `json:"request,omitempty"`
	// UID and GID are what the job runs as: set, with Attestation, by the agent that
	// accepted the job.
	UID uint32 `json:"uid,omitempty"`
	GID uint32 `json:"gid,omitempty"`
	// Attestation is the accepting agent's credential, bound to attestContent.
	Attestation string `json:"attestation,omitempty"`
	// Accepted is when it was accepted.
	Accepted time.Time `json:"accepted,omitzero"`
}

// Prover makes and checks MUNGE credentials: identity.Munge. A nil Prover is an agent
// run with --auth none: nothing is checked.
type Prover interface {
	Seal(ctx context.Context, content []byte) (string, error)
	SealFor(ctx context.Context, content []byte, uid uint32) (string, error)
	Verify(ctx context.Context, cred string, content []byte, f identity.Freshness) (identity.Caller, error)
	Who(ctx context.Context, cred string) (identity.Caller, error)
}

// Sealer makes a submitter's credential: identity.Munge, or nil for none.
type Sealer interface {
	Seal(ctx context.Context, content []byte) (string, error)
}

// jobContent is what a job's credentials are bound to: "gangrun job", its id and its
// spec as queued (JSON, as this package writes it). What the spec holds is what the
// step runs; a field an older reader drops changes the content, and is refused rather
// than run unseen.
func jobContent(spec Spec) []byte {
	b, _ := json.Marshal(spec)
	return append([]byte("gangrun job "+spec.ID+"\n"), b...)
}

// attestContent is what an accepting agent's attestation is bound to: the job's
// content, the ids it runs as, and the digest of the submitter's credential.
func attestContent(spec Spec, uid, gid uint32, cred string) []byte {
	head := fmt.Sprintf("gangrun accepted uid=%d gid=%d credential=%s\n", uid, gid, identity.Digest(cred))
	return append([]byte(head), jobContent(spec)...)
}

// authFor makes the Auth a job of spec (its id set) is written with; nil writes none.
type authFor func(ctx context.Context, spec Spec) (*Auth, error)

// sealed is the authFor of a submitter whose sealer makes its credentials: the job's
// credential, bound to the job as queued (nil for a nil sealer).
func sealed(sealer Sealer) authFor {
	if sealer == nil {
		return nil
	}
	return func(ctx context.Context, spec Spec) (*Auth, error) {
		cred, err := sealer.Seal(ctx, jobContent(spec))
		if err != nil {
			return nil, fmt.Errorf("the submitter's MUNGE credential: %w", err)
		}
		return &Auth{Credential: cred}, nil
	}
}

// authOps are the operations that write the Auth of spec that auth makes (none when
// auth is nil).
func authOps(ctx context.Context, auth authFor, spec Spec) ([]store.Op, error) {
	if auth == nil {
		return nil, nil
	}
	a, err := auth(ctx, spec)
	if err != nil {
		return nil, err
	}
	b, _ := schema.Marshal(schema.JobAuth, a)
	return []store.Op{{Verb: store.Set, Key: authKey(spec.ID), Value: b}}, nil
}

// refusal is a job refused for its credential: the reason it ends with.
type refusal struct{ why string }

func (r *refusal) Error() string { return string(reason.InvalidCredential) + ": " + r.why }

// acceptJob accepts pending job j for the controller whose prover is p: it checks the
// submitter's credential (see above) and writes the job's uid, gid and the attestation
// with the credential's replay marker. A credential refused ends the job FAILED.
func (c *Controller) acceptJob(ctx context.Context, j Job) error {
	a, why := j.Auth, ""
	var uid, gid uint32
	var expires time.Time
	switch {
	case a == nil || a.Credential == "":
		why = "no MUNGE credential: the job was not submitted with one (gangrun submit makes one where munged runs), or its record was written past gangrun"
	case a.Request != "":
		why = "a credential bound to a request, on a job no agent accepted"
	default:
		u, g, caller, err := runAs(ctx, c.prover, a.Credential, j.Spec)
		if err != nil {
			var r *refusal
			if !errors.As(err, &r) {
				return err
			}
			why = r.why
		}
		uid, gid, expires = u, g, caller.Expires()
		if err == nil && caller.UID != 0 && caller.UID != agentUID() {
			// A priority or a negative nice is an operator's (root's), whichever way the
			// job was queued: gangrun submit and sbatch check it too, but the record may
			// have been written past them.
			if err := CheckOperatorOnly(j.Spec); err != nil {
				why = err.Error()
			}
		}
	}
	now := c.now().UTC()
	if why != "" {
		return c.refuse(ctx, j, why)
	}
	att, err := c.prover.Seal(ctx, attestContent(j.Spec, uid, gid, a.Credential))
	if err != nil {
		return fmt.Errorf("job %s: the attestation: %w", j.Spec.ID, err)
	}
	acc := *a
	acc.UID, acc.GID, acc.Attestation, acc.Accepted = uid, gid, att, now
	b, _ := schema.Marshal(schema.JobAuth, acc)
	seen, _ := schema.Marshal(schema.CredentialSeen, seenMark{Job: j.Spec.ID, Expires: expires})
	ops := []store.Op{allocator.LeaderFence(c.session), {Verb: store.CAS, Key: authKey(j.Spec.ID), Value: b, Index: j.AuthIndex},
		{Verb: store.CheckNotExists, Key: seenPrefix + identity.Digest(a.Credential)},
		{Verb: store.Set, Key: seenPrefix + identity.Digest(a.Credential), Value: seen}}
	res, err := c.s.Txn(ctx, ops)
	var te *store.TxnError
	switch {
	case err == nil:
		c.written.Wrote(jobsPrefix, res.Index)
		return nil
	case errors.As(err, &te) && len(te.Errors) == 1 && te.Errors[0].Key == seenPrefix+identity.Digest(a.Credential):
		return c.refuse(ctx, j, "replayed: its credential was accepted before, for another record")
	case errors.Is(err, store.ErrTxnRejected) && !allocator.LostLeadership(err):
		return nil // the record changed meanwhile: the next pass sees it
	}
	return err
}

// seenMark is a replay marker's value: the job that used the credential, and when the
// marker may go (the credential has expired by then).
type seenMark struct {
	Job     string    `json:"job"`
	Expires time.Time `json:"expires"`
}

// runAs checks submitter credential cred (fresh, of this cluster, bound to spec) and
// returns the uid and gid spec runs as: the credential's, when its uid is the job's
// user's on this node; the user's own (primary group), when the credential is root's
// (root submits as any user, as sbatch --uid). A *refusal says why not.
func runAs(ctx context.Context, p Prover, cred string, spec Spec) (uint32, uint32, identity.Caller, error) {
	return runAsOf(ctx, p, cred, jobContent(spec), spec.User)
}

// runAsOf is runAs for a credential bound to content, of a job of user's.
func runAsOf(ctx context.Context, p Prover, cred string, content []byte, user string) (uint32, uint32, identity.Caller, error) {
	caller, err := p.Verify(ctx, cred, content, identity.FreshOrReplayed)
	if err != nil {
		if checkerTrouble(ctx, err) {
			return 0, 0, caller, err // the checker's trouble, not the job's: tried again
		}
		return 0, 0, caller, &refusal{credentialWhy(err)}
	}
	u, err := proc.LookupUser(user)
	if errors.Is(err, proc.ErrUnknownUser) {
		return 0, 0, caller, &refusal{fmt.Sprintf("the job's user %q has no account on the elected agent's node (a cluster's users exist on every node, as Slurm's)", user)}
	}
	if err != nil {
		return 0, 0, caller, err // the node's user database failing: tried again
	}
	switch caller.UID {
	case u.UID:
		return caller.UID, caller.GID, caller, nil
	case 0:
		return u.UID, u.GID, caller, nil
	}
	return 0, 0, caller, &refusal{fmt.Sprintf("the job says user %s (uid %d), its credential is uid %d's (%s)", user, u.UID, caller.UID, userName(caller.UID))}
}

// checkerTrouble reports whether err is the checker's own trouble (munged down, ctx
// ended), not the credential's: the check is tried again later.
func checkerTrouble(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, identity.ErrNoDaemon) || errors.Is(err, identity.ErrMunge) || errors.Is(err, identity.ErrNoMunge)
}

// credentialWhy says why a credential was refused, in a reason's words.
func credentialWhy(err error) string {
	switch {
	case errors.Is(err, identity.ErrMissing):
		return "no MUNGE credential"
	case errors.Is(err, identity.ErrMismatch):
		return "its credential was made for another job or other content (the record was changed or copied after it was submitted)"
	case errors.Is(err, identity.ErrInvalid):
		return "its credential is not of this cluster (another MUNGE key, or damaged)"
	case errors.Is(err, identity.ErrExpired):
		return "its credential had expired when the cluster first saw it: " + err.Error()
	case errors.Is(err, identity.ErrRewound):
		return "its credential was made in the future (the clocks of the submit host and the agent's disagree): " + err.Error()
	}
	return err.Error()
}

// userName is uid's name on this node, or "unknown here".
func userName(uid uint32) string {
	u, err := proc.LookupUser(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return "unknown here"
	}
	return u.Name
}

// refuse ends pending job j FAILED for why, with an audit entry, in one transaction;
// its request and grant go on the next pass, as an ended job's do.
func (c *Controller) refuse(ctx context.Context, j Job, why string) error {
	r := &refusal{why}
	c.log.Warn("job refused", zap.String("job", j.Spec.ID), zap.String("reason", r.Error()))
	entry := audit.Op(sealEntry(ctx, c.prover, audit.Entry{At: c.now().UTC(), User: "gangrun", Token: "agent", Action: audit.ActionRefuse,
		Target: "job " + j.Spec.ID, Owner: j.Spec.User, Detail: r.Error()}))
	_, _, err := c.update(ctx, j.Spec.ID, func(j *Job) bool {
		if j.State.apply(Transition{Event: EvRefuse, Words: r.Error()}) != nil {
			return false // no longer pending
		}
		j.State.ExitCode, j.State.Ended = 1, c.now().UTC()
		return true
	}, entry)
	return err
}

// checkAttested checks job j's attestation, against the job as it is now, for a step
// or the controller about to start it, and returns the uid and gid it runs as. maker
// is the uid the attestation must be made by (the agents', root). A *refusal says why
// it may not run.
func checkAttested(ctx context.Context, p Prover, j *Job, maker uint32) (uint32, uint32, error) {
	a := j.Auth
	if a == nil || a.Credential == "" {
		return 0, 0, &refusal{"no MUNGE credential"}
	}
	if a.Attestation == "" {
		return 0, 0, &refusal{"no agent accepted it (its record was written past gangrun, or by a cluster without MUNGE)"}
	}
	sub, err := p.Who(ctx, a.Credential)
	if err != nil {
		if checkerTrouble(ctx, err) {
			return 0, 0, err
		}
		return 0, 0, &refusal{"the submitter's " + credentialWhy(err)}
	}
	if sub.UID != a.UID && sub.UID != 0 {
		return 0, 0, &refusal{fmt.Sprintf("it runs as uid %d, its submitter's credential is uid %d's", a.UID, sub.UID)}
	}
	agent, err := p.Verify(ctx, a.Attestation, attestContent(j.Spec, a.UID, a.GID, a.Credential), identity.Kept)
	if err != nil {
		if checkerTrouble(ctx, err) {
			return 0, 0, err
		}
		if errors.Is(err, identity.ErrMismatch) {
			return 0, 0, &refusal{"the job's record changed after it was accepted (its spec, user or ids do not match the agent's attestation)"}
		}
		return 0, 0, &refusal{"the agent's attestation: " + credentialWhy(err)}
	}
	if agent.UID != maker && agent.UID != 0 {
		return 0, 0, &refusal{fmt.Sprintf("its attestation was made by uid %d, not by a gangrun agent (uid %d)", agent.UID, maker)}
	}
	return a.UID, a.GID, nil
}

// agentUID is the uid the agents run as, whose attestations a step takes: this
// process's (root on a cluster, as slurmd).
func agentUID() uint32 { return uint32(os.Geteuid()) }

// checkStart checks pending job j's attestation before the controller starts it: a job
// whose record changed after it was accepted is refused here, before any node is told
// to run it (each step checks again). Checks already passed are remembered by what
// they covered.
func (c *Controller) checkStart(ctx context.Context, j Job) (bool, error) {
	key := ""
	if a := j.Auth; a != nil {
		key = identity.Digest(a.Attestation + "\n" + string(attestContent(j.Spec, a.UID, a.GID, a.Credential)))
		if _, ok := c.attested.Load(key); ok {
			return true, nil
		}
	}
	_, _, err := checkAttested(ctx, c.prover, &j, agentUID())
	var r *refusal
	switch {
	case errors.As(err, &r):
		return false, c.refuse(ctx, j, r.why)
	case err != nil:
		return false, err
	}
	c.attested.Store(key, true)
	return true, nil
}

// stepUser is the user a step runs job j's workers as, proven by its attestation
// (checkAttested): the attested uid as this node's user database names it, which
// must be the job's user, with the attested gid as its group. A *refusal says why not.
func stepUser(ctx context.Context, p Prover, j *Job, node string) (*proc.User, error) {
	uid, gid, err := checkAttested(ctx, p, j, agentUID())
	if err != nil {
		return nil, err
	}
	u, err := proc.LookupUser(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return nil, &refusal{fmt.Sprintf("uid %d, which the job runs as, has no user on node %s", uid, node)}
	}
	if u.Name != j.Spec.User {
		return nil, &refusal{fmt.Sprintf("uid %d is %s on node %s, not the job's user %s (the nodes' user databases disagree)", uid, u.Name, node, j.Spec.User)}
	}
	u.GID = gid
	return u, nil
}

// seenPurgeInterval is how often the elected agent deletes the replay markers of
// credentials that have expired (they can no longer be accepted anyway).
const seenPurgeInterval = time.Minute

// purgeSeen deletes the replay markers that expired before now, fenced by the
// controller's leadership.
func (c *Controller) purgeSeen(ctx context.Context, now time.Time) error {
	entries, _, err := c.s.List(ctx, seenPrefix)
	if err != nil {
		return err
	}
	ops := []store.Op{allocator.LeaderFence(c.session)}
	flush := func() error {
		if len(ops) == 1 {
			return nil
		}
		_, err := c.s.Txn(ctx, ops)
		ops = ops[:1]
		if errors.Is(err, store.ErrTxnRejected) && !allocator.LostLeadership(err) {
			return nil // changed meanwhile: the next purge
		}
		return err
	}
	for _, e := range entries {
		var m seenMark
		if err := schema.Unmarshal(schema.CredentialSeen, e.Value, &m); err == nil && now.Before(m.Expires) || errors.Is(err, schema.ErrNewer) {
			continue // in use; or a newer gangrun's, which says when it may go
		}
		ops = append(ops, store.Op{Verb: store.DeleteCAS, Key: e.Key, Index: e.ModifyIndex})
		if len(ops) == store.MaxTxnOps {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// sealEntry is e sealed by p (audit.Seal), so that `gangrun audit` can tell the
// cluster's entries from entries anyone wrote into Consul; e as it is when p is nil, or
// when sealing fails (the action is recorded all the same).
func sealEntry(ctx context.Context, p Prover, e audit.Entry) audit.Entry {
	if p == nil {
		return e
	}
	sealed, err := audit.Seal(ctx, e, p)
	if err != nil {
		return e
	}
	return sealed
}

// sealedRendezvous is, with MUNGE, how a job's steps and its controller see job id's
// rendezvous (its leader, members, assignments and heartbeats): every value sealed by
// the writer and taken only when sealed by root or the agents' uid (identity.Sealed), so
// that no user can tell a job's steps where the master is or what checkpoint to load.
// nil without MUNGE.
func sealedRendezvous(p Prover, id string) func(store.Store) store.Store {
	if p == nil {
		return nil
	}
	return func(s store.Store) store.Store {
		return identity.Sealed(s, p, trustedMaker, rendezvous.JobPrefixes(id)...)
	}
}

// trustedMaker reports whether uid is one a job's records may be sealed by: root, or the
// agents' own uid.
func trustedMaker(uid uint32) bool { return uid == 0 || uid == agentUID() }
