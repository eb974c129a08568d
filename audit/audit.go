// Package audit is the cluster's audit log: every administrative action (cancelling
// another user's job, drain, resume, a policy change, a pre-emption) leaves an Entry in
// Consul, kept for a retention, listed by `gangrun audit` (docs/acl.md).
//
// Keys, under gangrun/audit/:
//
//	<day>/<nanos>-<rand>   one Entry: day is its UTC date (YYYY-MM-DD), nanos the Unix
//	                       time in nanoseconds, 19 digits, rand 8 hex digits, so keys
//	                       sort in time order and two hosts never collide
//
// The elected agent deletes the days older than the retention (Keep), as it folds
// accounting records (job.KeepAccounts).
package audit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
)

// Prefix is where the audit log lives.
const Prefix = "gangrun/audit/"

// dayLayout names a day in the keys: a UTC date.
const dayLayout = "2006-01-02"

// Defaults of the log's periods.
const (
	// DefaultRetention is how long an entry is kept (agent --audit-retention): 400 days,
	// as long as accounting's daily rollups.
	DefaultRetention = 400 * 24 * time.Hour
	// DefaultPurgeInterval is how often the elected agent deletes the days past the
	// retention: hourly.
	DefaultPurgeInterval = time.Hour
)

// The actions recorded. Pre-emption is for the scheduler to record when it pre-empts.
const (
	ActionCancel    = "cancel"
	ActionDrain     = "drain"
	ActionResume    = "resume"
	ActionPolicySet = "policy-set"
	ActionPreempt   = "preempt"
	// ActionHold is a hold, uhold, release, requeue or requeuehold of another user's
	// job (scontrol; the entry's Detail says which).
	ActionHold = "hold"
	// ActionUpdate is an scontrol update of a job, anyone's (the entry's Detail says
	// what it changed, and why it was refused when it was).
	ActionUpdate = "update"
	// ActionSignal is a signal sent to another user's running job without cancelling
	// it (scancel --signal; the entry's Detail names the signal and where it went).
	ActionSignal = "signal"
	// ActionRefuse is the elected agent refusing a job or a request whose MUNGE
	// credential does not prove its user (reason.InvalidCredential), and a step
	// refusing to run a job whose record does not match its attestation.
	ActionRefuse = "refuse"
)

// Entry is one administrative action: who did what, to what, when and from where. Its
// JSON fields are what `gangrun audit --json` prints; fields may be added, none
// renamed.
type Entry struct {
	// At is when it was done (UTC).
	At time.Time `json:"at"`
	// User is the Unix user who ran the command (the scheduler's actions: "gangrun").
	User string `json:"user"`
	// Token is whose Consul ACL token did it: "operator", "management", "agent",
	// "user:NAME", or "none" when Consul's ACLs are off. Never the token's secret.
	Token string `json:"token"`
	// Accessor is the token's AccessorID, Consul's public name of it
	// (`consul acl token read -id` finds it); "" when ACLs are off.
	Accessor string `json:"accessor,omitempty"`
	// Host is the host it was done from (its host name).
	Host string `json:"host"`
	// Action is one of the Action constants; Target what it acted on ("job 42",
	// "node n1", "policy"); Owner the user whose job it was, for a job.
	Action string `json:"action"`
	Target string `json:"target"`
	Owner  string `json:"owner,omitempty"`
	// Detail is the rest: a drain's reason, a policy's summary.
	Detail string `json:"detail,omitempty"`
	// Seal is, for an entry the elected agent or a step wrote where MUNGE is on, the
	// writer's credential (root's, decodable by root only) bound to the entry's other
	// fields (Seal): with Consul's ACLs off anyone may write an entry, and only a sealed
	// one is the cluster's word (Check).
	Seal string `json:"seal,omitempty"`
}

// Sealer makes a credential bound to content: identity.Munge.
type Sealer interface {
	Seal(ctx context.Context, content []byte) (string, error)
}

// Verifier checks a credential bound to content, whatever its age, and says whose it is:
// identity.Munge.Verify with identity.Kept.
type Verifier func(ctx context.Context, cred string, content []byte) (uid uint32, err error)

// sealContent is what an entry's Seal is bound to: the entry without its Seal.
func sealContent(e Entry) []byte {
	e.Seal = ""
	b, _ := json.Marshal(e)
	return append([]byte("gangrun audit\n"), b...)
}

// Seal returns e with its time and host filled (as Op fills them) and sealed by s.
// Errors: s's.
func Seal(ctx context.Context, e Entry, s Sealer) (Entry, error) {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	e.At = e.At.UTC()
	if e.Host == "" {
		e.Host, _ = os.Hostname()
	}
	cred, err := s.Seal(ctx, sealContent(e))
	if err != nil {
		return e, fmt.Errorf("seal the audit entry: %w", err)
	}
	e.Seal = cred
	return e, nil
}

// The outcomes of Check.
const (
	// Sealed: sealed by a writer the caller trusts (root, the agents).
	Sealed = "sealed"
	// Unsealed: no seal (written with Consul's ACLs guarding it, or past gangrun).
	Unsealed = "unsealed"
	// Forged: a seal that does not hold for the entry, or one made by an untrusted uid.
	Forged = "forged"
)

// ErrUncheckable is wrapped by a Verifier's error when the check could not be made
// here (munged not answering, or a user who may not decode root's credentials): the
// entry is then neither sealed nor forged as far as the caller knows.
var ErrUncheckable = errors.New("the seal cannot be checked here")

// Check says whether e is sealed by a trusted uid (trusted: root, the agents' uid),
// Unsealed, or Forged (with why); an error (ErrUncheckable) when the check itself
// could not be made.
func Check(ctx context.Context, e Entry, v Verifier, trusted func(uid uint32) bool) (string, string, error) {
	if e.Seal == "" {
		return Unsealed, "", nil
	}
	uid, err := v(ctx, e.Seal, sealContent(e))
	if errors.Is(err, ErrUncheckable) {
		return "", "", err
	}
	if err != nil {
		return Forged, err.Error(), nil
	}
	if !trusted(uid) {
		return Forged, fmt.Sprintf("sealed by uid %d, not by a gangrun agent", uid), nil
	}
	return Sealed, "", nil
}

// key is the entry's key (see the package comment).
func key(e Entry) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s%s/%019d-%s", Prefix, e.At.UTC().Format(dayLayout), e.At.UnixNano(), hex.EncodeToString(b[:]))
}

// Op is the operation that writes e (At now, Host this host's name when unset), to be
// applied in the transaction of the action it records, so the two happen together or
// not at all.
func Op(e Entry) store.Op {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	e.At = e.At.UTC()
	if e.Host == "" {
		e.Host, _ = os.Hostname()
	}
	b, _ := schema.Marshal(schema.AuditEntry, e)
	return store.Op{Verb: store.Set, Key: key(e), Value: b}
}

// Write records e on its own (see Op).
func Write(ctx context.Context, s store.Store, e Entry) error {
	if _, err := s.Txn(ctx, []store.Op{Op(e)}); err != nil {
		return fmt.Errorf("write the audit log: %w", err)
	}
	return nil
}

// List returns the entries at or after since, oldest first, of user (the Unix user or
// the token's user; "" for everyone). Entries that do not decode are skipped, and so
// are those a newer gangrun wrote (ListAll counts them).
func List(ctx context.Context, s store.Store, since time.Time, user string) ([]Entry, error) {
	out, _, err := ListAll(ctx, s, since, user)
	return out, err
}

// ListAll is List, and why each entry of the days from since's on that a newer gangrun
// wrote was left out (errors wrapping schema.ErrNewer: who wrote them cannot be told).
func ListAll(ctx context.Context, s store.Store, since time.Time, user string) ([]Entry, []error, error) {
	entries, _, err := s.List(ctx, Prefix)
	if err != nil {
		return nil, nil, err
	}
	sinceDay := since.UTC().Format(dayLayout)
	var out []Entry
	var newer []error
	for _, kv := range entries {
		day, _, _ := strings.Cut(strings.TrimPrefix(kv.Key, Prefix), "/")
		if !since.IsZero() && day < sinceDay {
			continue
		}
		var e Entry
		if err := schema.Unmarshal(schema.AuditEntry, kv.Value, &e); errors.Is(err, schema.ErrNewer) {
			newer = append(newer, fmt.Errorf("%s: %w", kv.Key, err))
			continue
		} else if err != nil || e.At.Before(since) {
			continue
		}
		if user != "" && e.User != user && e.Token != "user:"+user {
			continue
		}
		out = append(out, e)
	}
	return out, newer, nil
}

// Purge deletes the days of entries before before's day and returns how many days it
// deleted. fence ops (the leader's) go into each delete's transaction.
func Purge(ctx context.Context, s store.Store, fence []store.Op, before time.Time) (int, error) {
	entries, _, err := s.List(ctx, Prefix)
	if err != nil {
		return 0, err
	}
	cut := before.UTC().Format(dayLayout)
	var days []string
	for _, kv := range entries {
		day, _, _ := strings.Cut(strings.TrimPrefix(kv.Key, Prefix), "/")
		if day < cut && (len(days) == 0 || days[len(days)-1] != day) {
			days = append(days, day)
		}
	}
	for i, day := range days {
		ops := append(append([]store.Op{}, fence...), store.Op{Verb: store.DeleteTree, Key: Prefix + day + "/"})
		if _, err := s.Txn(ctx, ops); err != nil {
			return i, fmt.Errorf("purge the audit log of %s: %w", day, err)
		}
	}
	return len(days), nil
}

// Keep returns the elected agent's audit keeper, the signature
// allocator.AgentConfig.Leader takes (allocator.Periodic): on taking the lead and every
// interval (0: DefaultPurgeInterval) it deletes the days of entries older than retention
// (0: DefaultRetention), fenced by the leader's session.
func Keep(log *zap.Logger, retention, interval time.Duration) func(ctx context.Context, s store.Store, session string) error {
	if retention <= 0 {
		retention = DefaultRetention
	}
	if interval <= 0 {
		interval = DefaultPurgeInterval
	}
	if log == nil {
		log = zap.NewNop()
	}
	return allocator.Periodic(log, interval, "audit: purge the days past the retention", func(ctx context.Context, s store.Store, fence []store.Op) error {
		n, err := Purge(ctx, s, fence, time.Now().Add(-retention))
		if err == nil && n > 0 {
			log.Info("audit: days past the retention purged", zap.Int("days", n), zap.Duration("retention", retention))
		}
		return err
	})
}
