package job

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/acl"
	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/identity"
	"github.com/gangrun/gangrun/internal/proc"
	"github.com/gangrun/gangrun/internal/schema"
	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/policy"
)

// Requests to the elected agent (docs/acl.md). With Consul's ACLs on, a user's token
// may write only gangrun/batch/users/<user>/ (acl.UserRules): `gangrun submit` and
// `gangrun cancel` under such a token write a Request there and wait for its Answer,
// which the elected agent writes (ServeRequests), and the key's place proves who asks.
// With MUNGE (agents' --auth munge), every request also carries the asker's
// credential, bound to the request's key and text: the agent acts for the uid the
// credential proves, whose name must be the box's, whatever the box or the request
// say; and then, with or without ACLs, cancels, drains, resumes and policy changes go
// through the boxes (root's too), so that the agent checks who asks.
//
//	gangrun/batch/users/<user>/<kind>-<nanos>-<rand>   boxed request; kind submit,
//	                                                   cancel, hold, update, signal,
//	                                                   drain, resume or policy
//
// A submit's job is queued in the transaction that writes its answer (a check-and-set
// of the request), so a request is carried out once or not at all; the asker deletes
// the request once answered, or, with a check-and-set, when it gives up waiting (then
// nothing was done). Answered requests left behind are deleted after requestKeep.

// Request kinds.
const (
	requestSubmit = "submit"
	requestCancel = "cancel"
	requestDrain  = "drain"
	requestResume = "resume"
	requestPolicy = "policy"
	requestHold   = "hold"   // scontrol hold, uhold, release (Request.HoldOp)
	requestUpdate = "update" // scontrol update (Request.Update)
	requestSignal = "signal" // scancel --signal (Request.Signal, Request.Target)
)

// requestKeep is how long an answered request nobody took is kept.
const requestKeep = 10 * time.Minute

// DefaultRequestWait is how long `gangrun submit` and `gangrun cancel` under a user's
// token wait for the elected agent's answer.
const DefaultRequestWait = time.Minute

// Request is what a user asks of the elected agent.
type Request struct {
	Kind string `json:"kind"`
	// Spec and Array are a submit's job (Array nil for a single job).
	Spec  *Spec  `json:"spec,omitempty"`
	Array *Array `json:"array,omitempty"`
	// Job is a cancel's or hold's job id (or an array's); HoldOp the hold's operation.
	Job    string `json:"job,omitempty"`
	HoldOp HoldOp `json:"hold_op,omitempty"`
	// Signal and Target are a signal request's signal (its number) and where it goes
	// (SignalSteps, SignalBatch, SignalFull).
	Signal int    `json:"signal,omitempty"`
	Target string `json:"target,omitempty"`
	// Update is an update's change of the job.
	Update *Update `json:"update,omitempty"`
	// Node and Reason are a drain's node and reason (a resume's node).
	Node   string `json:"node,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Policy is a policy change's document (policy.Parse's input).
	Policy json.RawMessage `json:"policy,omitempty"`
	// Answer is the elected agent's, nil until it answers.
	Answer *Answer `json:"answer,omitempty"`
}

// boxed is a request as it lies in a box: the request's text as the asker wrote it
// (without its answer), the asker's MUNGE credential bound to requestContent of it, and
// the agent's answer.
type boxed struct {
	Request    json.RawMessage `json:"request"`
	Credential string          `json:"credential,omitempty"`
	Answer     *Answer         `json:"answer,omitempty"`
	// Seal is, with MUNGE, the elected agent's credential (root's, decodable by the
	// box's user) bound to the request and its answer (answerContent): with Consul's
	// ACLs off anyone may write an answer into a box, and the asker takes only a
	// sealed one.
	Seal string `json:"seal,omitempty"`
}

// answerContent is what an answer's seal is bound to: the request's key and text and
// the answer.
func answerContent(key string, text []byte, a *Answer) []byte {
	b, _ := json.Marshal(a)
	return append(append(requestContent(key, text), "\nanswer "...), b...)
}

// requestContent is what a request's credential is bound to: its key and its text.
func requestContent(key string, text []byte) []byte {
	return append([]byte("gangrun request "+key+"\n"), text...)
}

// Answer is the elected agent's answer to a Request.
type Answer struct {
	At time.Time `json:"at"`
	// ID and Tasks are a submitted job's id and an array's task ids.
	ID    string   `json:"id,omitempty"`
	Tasks []string `json:"tasks,omitempty"`
	// Cancelled counts the jobs a cancel cancelled (0: they had ended or were ending),
	// Held the jobs a hold or release changed.
	Cancelled int `json:"cancelled,omitempty"`
	Held      int `json:"held,omitempty"`
	// Signalled counts the jobs a signal request reached.
	Signalled int `json:"signalled,omitempty"`
	// NotPending says a hold or release found the job no longer pending (ErrNotPending),
	// Finished that it had ended (ErrFinished).
	NotPending bool `json:"not_pending,omitempty"`
	Finished   bool `json:"finished,omitempty"`
	// Pending and Refused say a requeue found the job pending (ErrPending) or stopping
	// (ErrNotRunning).
	Pending bool `json:"pending,omitempty"`
	Refused bool `json:"refused,omitempty"`
	// Disabled says a requeue found the job submitted with --no-requeue
	// (ErrRequeueDisabled).
	Disabled bool `json:"disabled,omitempty"`
	// Updated counts the jobs an update changed; Slurm names its refusal in Slurm's
	// words (an update's error: ErrAccessDenied's, ErrInvalidPartition's, ...), Error
	// then the detail.
	Updated int    `json:"updated,omitempty"`
	Slurm   string `json:"slurm,omitempty"`
	// Array says the cancel was of a job array's tasks.
	Array bool `json:"array,omitempty"`
	// Error is why it was not done; Invalid marks the user's error (a bad spec, an
	// unknown job), Owner the job's user when it is another's, Denied a request the
	// asker may not make (Error says why).
	Error   string `json:"error,omitempty"`
	Invalid bool   `json:"invalid,omitempty"`
	Owner   string `json:"owner,omitempty"`
	Denied  bool   `json:"denied,omitempty"`
	// By says how the agent knew the asker ("your MUNGE credential is bob's", "your
	// token is bob's"), for a refusal's words.
	By string `json:"by,omitempty"`
	// Detail is a done request's summary (a policy change's).
	Detail string `json:"detail,omitempty"`
}

// ErrNotYours marks a cancel of another user's job under a user's token.
var ErrNotYours = errors.New("permission denied")

// NotYoursError is a cancel refused because job ID is Owner's, not User's; By says how
// the agent knew the asker ("your token is bob's").
type NotYoursError struct {
	ID, Owner, User, By string
}

func (e *NotYoursError) Error() string {
	by := e.By
	if by == "" {
		by = "your token is " + e.User + "'s"
	}
	return fmt.Sprintf("permission denied: job %s belongs to %s (%s)", e.ID, e.Owner, by)
}

// ErrDenied marks a request the elected agent refused to its asker: an operator's
// action (drain, resume, a policy change) asked by a user, or a request whose
// credential does not prove its box's user. The error's text says why.
var ErrDenied = errors.New("permission denied")

// deniedError is an ErrDenied with the agent's words.
type deniedError struct{ why string }

func (e *deniedError) Error() string        { return e.why }
func (e *deniedError) Is(target error) bool { return target == ErrDenied }

// Is makes errors.Is(err, ErrNotYours) true.
func (e *NotYoursError) Is(target error) bool { return target == ErrNotYours }

// ErrNoAnswer marks a request the elected agent did not answer in time.
var ErrNoAnswer = errors.New("no answer from the cluster")

// requestKey is a new request key of user's, of kind.
func requestKey(user, kind string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s%s-%019d-%s", acl.UserPrefix(user), kind, time.Now().UnixNano(), hex.EncodeToString(b[:]))
}

// ask writes r as a new request of user's and waits up to wait for its answer; then it
// deletes the request. On no answer in time it withdraws the request (a check-and-set
// delete: when that fails, the answer came meanwhile and is taken) and returns
// ErrNoAnswer.
func ask(ctx context.Context, s store.Store, as Asker, r Request) (*Answer, error) {
	user, wait := as.User, as.Wait
	if wait <= 0 {
		wait = DefaultRequestWait
	}
	key := requestKey(user, r.Kind)
	text, _ := json.Marshal(r)
	box := boxed{Request: text}
	if as.Prover != nil {
		var err error
		if box.Credential, err = as.Prover.Seal(ctx, requestContent(key, text)); err != nil {
			return nil, fmt.Errorf("the request's MUNGE credential: %w", err)
		}
	}
	b, _ := schema.Marshal(schema.RequestBox, box)
	res, err := s.Txn(ctx, []store.Op{{Verb: store.CheckNotExists, Key: key}, {Verb: store.Set, Key: key, Value: b}})
	if err != nil {
		return nil, fmt.Errorf("write request %s: %w", key, err)
	}
	deadline := time.Now().Add(wait)
	index := res.Index
	for {
		left := time.Until(deadline)
		if left > 0 {
			entries, idx, err := s.WatchList(ctx, key, index, min(left, 10*time.Second))
			if err != nil {
				if ctx.Err() != nil {
					// Stopped (a signal): take the request back, unless it was answered.
					return withdraw(context.WithoutCancel(ctx), s, as, key, text, ctx.Err())
				}
				return nil, err
			}
			index = idx
			for _, e := range entries {
				if e.Key != key {
					continue
				}
				if ans, ok, err := take(ctx, s, as, key, text, e); ok || err != nil {
					return ans, err
				}
			}
			continue
		}
		// Give up: withdraw the request unless it was answered meanwhile.
		e, err := s.Get(ctx, key)
		if err != nil {
			return nil, err
		}
		if e != nil {
			if ans, ok, err := take(ctx, s, as, key, text, *e); ok || err != nil {
				return ans, err
			}
			if _, err := s.Txn(ctx, []store.Op{{Verb: store.DeleteCAS, Key: key, Index: e.ModifyIndex}}); errors.Is(err, store.ErrTxnRejected) {
				continue // answered meanwhile
			}
		}
		return nil, fmt.Errorf("%w within %s: no elected gangrun agent answered; nothing was done", ErrNoAnswer, wait)
	}
}

// ErrForgedAnswer marks an answer in a box that is not the elected agent's: its seal is
// missing or does not hold for the request as asked. Nothing can be said of what was
// done.
var ErrForgedAnswer = errors.New("the answer is not the cluster's")

// take returns the answer at e (the request at key, asked as text) once it is answered
// (ok), and deletes the request. With as.Prover, only an answer sealed by root for this
// request is taken; any other is ErrForgedAnswer.
func take(ctx context.Context, s store.Store, as Asker, key string, text []byte, e store.Entry) (*Answer, bool, error) {
	var got boxed
	if schema.Unmarshal(schema.RequestBox, e.Value, &got) != nil || got.Answer == nil {
		return nil, false, nil
	}
	_, _ = s.Txn(ctx, []store.Op{{Verb: store.Delete, Key: key}})
	if as.Prover != nil {
		agent, err := as.Prover.Verify(ctx, got.Seal, answerContent(key, text, got.Answer), identity.Kept)
		switch {
		case err != nil:
			return nil, true, fmt.Errorf("%w (its seal: %v): anyone who reaches Consul may write into a box; what was done is unknown (gangrun queue, gangrun nodes)", ErrForgedAnswer, err)
		case agent.UID != 0:
			return nil, true, fmt.Errorf("%w: sealed by uid %d, not by a gangrun agent; what was done is unknown (gangrun queue, gangrun nodes)", ErrForgedAnswer, agent.UID)
		}
	}
	return got.Answer, true, nil
}

// withdraw takes back the unanswered request at key after why stopped its asker: its
// answer when it was answered meanwhile, else why, wrapped to say nothing was done (or
// that the request may stand, when it could not be removed).
func withdraw(ctx context.Context, s store.Store, as Asker, key string, text []byte, why error) (*Answer, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for range 3 {
		e, err := s.Get(ctx, key)
		if err != nil {
			break
		}
		if e == nil {
			return nil, fmt.Errorf("stopped (%w): the request was withdrawn; nothing was done", why)
		}
		if ans, ok, err := take(ctx, s, as, key, text, *e); ok || err != nil {
			return ans, err
		}
		if _, err := s.Txn(ctx, []store.Op{{Verb: store.DeleteCAS, Key: key, Index: e.ModifyIndex}}); err == nil {
			return nil, fmt.Errorf("stopped (%w): the request was withdrawn; nothing was done", why)
		}
	}
	return nil, fmt.Errorf("stopped (%w) and could not withdraw the request %s: it may still be carried out", why, key)
}

// Asker is who asks the elected agent through a request box: User names the box (a
// user token's user, or the Unix user running the command), Prover makes the
// request's MUNGE credential and checks the agent's seal on the answer (nil: neither,
// where no agent checks credentials), and Wait bounds the wait for the answer (0:
// DefaultRequestWait).
type Asker struct {
	User   string
	Prover Prover
	Wait   time.Duration
}

// SubmitAs submits spec (an array's tasks when a is not nil) as user through the
// user's request box: what a user's token, which may write nothing else, does. The
// job's user is user whatever spec says. Errors as Submit's (ErrInvalid for the user's
// mistakes), and ErrNoAnswer when no elected agent answered within wait.
func SubmitAs(ctx context.Context, s store.Store, user string, spec Spec, a *Array, wait time.Duration) (string, []string, error) {
	return Asker{User: user, Wait: wait}.Submit(ctx, s, spec, a)
}

// Submit is SubmitAs for as.
func (as Asker) Submit(ctx context.Context, s store.Store, spec Spec, a *Array) (string, []string, error) {
	spec.User = as.User
	ans, err := ask(ctx, s, as, Request{Kind: requestSubmit, Spec: &spec, Array: a})
	if err != nil {
		return "", nil, err
	}
	switch {
	case ans.Denied:
		return "", nil, &deniedError{ans.Error}
	case ans.Error != "" && ans.Invalid:
		return "", nil, &invalid{errors.New(ans.Error)}
	case ans.Error != "":
		return "", nil, errors.New(ans.Error)
	}
	return ans.ID, ans.Tasks, nil
}

// CancelAs cancels job id (or every task of job array id) as user through the user's
// request box, when the job is user's: it returns how many jobs it cancelled (0: they
// had ended or were ending) and whether id is an array. Errors: *NotYoursError
// (ErrNotYours) for another's job, ErrNotFound, ErrNoAnswer.
func CancelAs(ctx context.Context, s store.Store, user, id string, wait time.Duration) (int, bool, error) {
	return Asker{User: user, Wait: wait}.Cancel(ctx, s, id)
}

// Cancel is CancelAs for as: root's cancels any job.
func (as Asker) Cancel(ctx context.Context, s store.Store, id string) (int, bool, error) {
	ans, err := ask(ctx, s, as, Request{Kind: requestCancel, Job: id})
	if err != nil {
		return 0, false, err
	}
	if err := ans.jobErr(id, as.User); err != nil {
		return 0, ans.Array, err
	}
	return ans.Cancelled, ans.Array, nil
}

// Hold does op (scontrol hold, uhold, release) on job id, or every task of job array id,
// through as's box: the job must be as's user's, unless as is root (an operator, whose
// hold is JobHeldAdmin). It returns how many jobs changed. Errors: *NotYoursError
// (ErrNotYours), ErrNotFound, ErrFinished, ErrNotPending, ErrHeldByOperator, ErrDenied,
// ErrNoAnswer.
func (as Asker) Hold(ctx context.Context, s store.Store, id string, op HoldOp) (int, error) {
	ans, err := ask(ctx, s, as, Request{Kind: requestHold, Job: id, HoldOp: op})
	if err != nil {
		return 0, err
	}
	if err := ans.jobErr(id, as.User); err != nil {
		return 0, err
	}
	return ans.Held, nil
}

// jobErr is the error answer ans gives user's request on job id, nil for none: the
// job's owner (*NotYoursError), the refusal its flags name (ErrNotPending,
// ErrFinished, ErrPending, ErrNotRunning, ErrRequeueDisabled, ErrHeldByOperator, else
// ErrDenied with the agent's words, ErrNotFound) or the agent's error. jobAnswer
// writes those flags.
func (ans Answer) jobErr(id, user string) error {
	var refused error
	switch {
	case ans.Owner != "":
		return &NotYoursError{ID: id, Owner: ans.Owner, User: user, By: ans.By}
	case ans.NotPending:
		refused = ErrNotPending
	case ans.Finished:
		refused = ErrFinished
	case ans.Pending:
		refused = ErrPending
	case ans.Refused:
		refused = ErrNotRunning
	case ans.Disabled:
		refused = ErrRequeueDisabled
	case ans.Denied && ans.Error == ErrHeldByOperator.Error():
		refused = ErrHeldByOperator
	case ans.Denied:
		return &deniedError{ans.Error}
	case ans.Invalid:
		refused = ErrNotFound
	case ans.Error != "":
		return errors.New(ans.Error)
	default:
		return nil
	}
	return fmt.Errorf("job %s: %w", id, refused)
}

// jobAnswer is the answer to a request on job id that err (not nil) refused: the flag
// of each refusal Answer.jobErr turns back into its error, or err itself.
func jobAnswer(id string, err error) (Answer, error) {
	switch {
	case errors.Is(err, ErrNotPending):
		return Answer{NotPending: true}, nil
	case errors.Is(err, ErrFinished):
		return Answer{Finished: true}, nil
	case errors.Is(err, ErrPending):
		return Answer{Pending: true}, nil
	case errors.Is(err, ErrNotRunning):
		return Answer{Refused: true}, nil
	case errors.Is(err, ErrRequeueDisabled):
		return Answer{Disabled: true}, nil
	case errors.Is(err, ErrHeldByOperator):
		return Answer{Denied: true, Error: ErrHeldByOperator.Error()}, nil
	case errors.Is(err, ErrNotFound):
		return Answer{Error: fmt.Sprintf("no job %q", id), Invalid: true}, nil
	}
	return Answer{}, err
}

// Drain drains node for reason, or with reason "" resumes it, through as's box: an
// operator's action, which the agent carries out for root only, recorded in the audit
// log. Errors: ErrDenied, allocator.ErrNotFound for a node never registered,
// ErrNoAnswer.
func (as Asker) Drain(ctx context.Context, s store.Store, node, reason string) error {
	kind := requestDrain
	if reason == "" {
		kind = requestResume
	}
	ans, err := ask(ctx, s, as, Request{Kind: kind, Node: node, Reason: reason})
	if err != nil {
		return err
	}
	switch {
	case ans.Denied:
		return &deniedError{ans.Error}
	case ans.Invalid:
		return fmt.Errorf("%s: %w", ans.Error, allocator.ErrNotFound)
	case ans.Error != "":
		return errors.New(ans.Error)
	}
	return nil
}

// SetPolicy sets the cluster's policy to doc (a policy document, policy.Parse's input)
// through as's box, for root only, and returns the agent's summary of it. Errors:
// ErrDenied, ErrInvalid (a document the agent refuses), ErrNoAnswer.
func (as Asker) SetPolicy(ctx context.Context, s store.Store, doc []byte) (string, error) {
	ans, err := ask(ctx, s, as, Request{Kind: requestPolicy, Policy: doc})
	if err != nil {
		return "", err
	}
	switch {
	case ans.Denied:
		return "", &deniedError{ans.Error}
	case ans.Invalid:
		return "", &invalid{errors.New(ans.Error)}
	case ans.Error != "":
		return "", errors.New(ans.Error)
	}
	return ans.Detail, nil
}

// ServeRequests returns the elected agent's server of users' requests, the signature
// allocator.AgentConfig.Leader takes: it follows gangrun/batch/users/ and carries out
// each request not yet answered, as the user whose box it is in, every write fenced by
// the leader's session: a submit queues the job as that user's (with its answer, in one
// transaction); a cancel cancels the job if it is that user's (any job for root), and
// answers with its owner if not; a drain, resume or policy change is done for root
// only, and recorded in the audit log. With prover (agent --auth munge) a request must
// carry a fresh credential, bound to it and never used before, of the box's user:
// otherwise it is refused, with an audit entry, and nothing is done.
func ServeRequests(log *zap.Logger, prover Prover) func(ctx context.Context, s store.Store, session string) error {
	if log == nil {
		log = zap.NewNop()
	}
	return func(ctx context.Context, s store.Store, session string) error {
		sv := &server{s: s, fence: allocator.LeaderFence(session), prover: prover, log: log}
		f := store.Follow(ctx, s, watchGap, acl.UsersPrefix)
		tick := time.NewTicker(controllerRetry)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-f.Changed():
			case <-tick.C:
			}
			answers, ok := f.Latest()
			if !ok {
				continue
			}
			sv.forget(answers[0].Entries)
			for _, e := range answers[0].Entries {
				err := sv.serve(ctx, e)
				switch {
				case ctx.Err() != nil:
					return nil
				case allocator.LostLeadership(err):
					return err // no longer the leader
				case err != nil:
					log.Warn("users' requests", zap.String("key", e.Key), zap.Error(err))
				}
			}
		}
	}
}

// server is the elected agent's side of the request boxes.
type server struct {
	s      store.Store
	fence  store.Op
	prover Prover
	log    *zap.Logger
	// served holds the requests this server answered: key → the request's index as it
	// read it then. A watch's view may still show one unanswered (it lags the server's
	// own writes); serving it again would refuse its credential as a replay, and write a
	// refusal into the audit log for a request that was carried out.
	served map[string]uint64
}

// forget drops from served the requests no longer in the boxes (entries: the boxes'
// whole listing).
func (sv *server) forget(entries []store.Entry) {
	if len(sv.served) == 0 {
		return
	}
	there := make(map[string]bool, len(entries))
	for _, e := range entries {
		there[e.Key] = true
	}
	for k := range sv.served {
		if !there[k] {
			delete(sv.served, k)
		}
	}
}

// asker is who a request comes from, as the agent knows it.
type asker struct {
	user string // the box's user, proven
	root bool   // uid 0 (with MUNGE) or the operator: any job, the operator's actions
	by   string // how it is known, for a refusal's words
	// cred and uid, gid are the request's credential and the ids a job it queues runs
	// as; caller is the uid the credential proves (MUNGE only).
	cred     string
	uid, gid uint32
	caller   uint32
	expires  time.Time
}

// serve carries out the request at e, if it is one not yet answered; an answered one
// older than requestKeep is deleted.
func (sv *server) serve(ctx context.Context, e store.Entry) error {
	s, fence := sv.s, sv.fence
	user, name, _ := strings.Cut(strings.TrimPrefix(e.Key, acl.UsersPrefix), "/")
	var box boxed
	var r Request
	if !boxName(user, sv.prover != nil) || name == "" || strings.Contains(name, "/") ||
		schema.Unmarshal(schema.RequestBox, e.Value, &box) != nil || json.Unmarshal(box.Request, &r) != nil {
		return nil // not a request, or a newer gangrun's (its asker waits for an agent that reads it): left alone
	}
	// The answer goes into the box at the box's own schema, which its asker reads.
	version, _ := schema.Of(e.Value)
	if box.Answer != nil {
		if time.Since(box.Answer.At) > requestKeep {
			_, err := s.Txn(ctx, []store.Op{fence, {Verb: store.DeleteCAS, Key: e.Key, Index: e.ModifyIndex}})
			if errors.Is(err, store.ErrTxnRejected) && !allocator.LostLeadership(err) {
				return nil
			}
			return err
		}
		return nil
	}
	if idx, ok := sv.served[e.Key]; ok && idx == e.ModifyIndex {
		return nil // answered by this server already: the view is older than the answer
	}
	var reader *uint32 // who may decode the answer's seal: the asker's uid, once known
	answer := func(a Answer) store.Op {
		a.At = time.Now().UTC()
		box.Answer = &a
		box.Seal = sv.sealAnswer(ctx, e.Key, user, reader, box.Request, &a)
		b, _ := schema.MarshalVersion(schema.RequestBox, version, box)
		return store.Op{Verb: store.CAS, Key: e.Key, Value: b, Index: e.ModifyIndex}
	}
	who, ans, err := sv.who(ctx, e.Key, user, r, box)
	if err != nil {
		return err
	}
	if who.cred != "" {
		reader = &who.caller
	}
	var also []store.Op
	if ans == nil {
		ans, also, err = sv.do(ctx, who, r, answer)
		if err != nil || ans == nil {
			return err
		}
	}
	ops := append([]store.Op{fence, answer(*ans)}, also...)
	if who.cred != "" {
		// Used, whatever the answer: a refused request is not tried again either.
		ops = append(ops, seenOps(who.cred, e.Key, who.expires)...)
	}
	_, err = s.Txn(ctx, ops)
	if err == nil {
		if sv.served == nil {
			sv.served = map[string]uint64{}
		}
		sv.served[e.Key] = e.ModifyIndex
	}
	if errors.Is(err, store.ErrTxnRejected) && !allocator.LostLeadership(err) {
		return nil
	}
	return err
}

// sealAnswer seals answer a to the request at key (text) in user's box, decodable by
// the asker only: uid reader, the uid its credential proved, else the box user's uid
// here. "" without MUNGE, or when no uid is known or munged fails (the asker then
// refuses the answer, and says so).
func (sv *server) sealAnswer(ctx context.Context, key, user string, reader *uint32, text []byte, a *Answer) string {
	if sv.prover == nil {
		return ""
	}
	var uid uint32
	if reader != nil {
		uid = *reader
	} else if u, err := proc.LookupUser(user); err == nil {
		uid = u.UID
	} else {
		return ""
	}
	seal, err := sv.prover.SealFor(ctx, answerContent(key, text, a), uid)
	if err != nil {
		sv.log.Warn("seal the answer", zap.String("key", key), zap.Error(err))
		return ""
	}
	return seal
}

// boxName reports whether user can name a box: a gangrun user name (acl.CheckUser),
// or, where credentials prove who asks, also root's.
func boxName(user string, proven bool) bool {
	return acl.CheckUser(user) == nil || proven && user == "root"
}

// seenOps mark credential cred used (by the request at key), once only.
func seenOps(cred, key string, expires time.Time) []store.Op {
	k := seenPrefix + identity.Digest(cred)
	b, _ := schema.Marshal(schema.CredentialSeen, seenMark{Job: key, Expires: expires})
	return []store.Op{{Verb: store.CheckNotExists, Key: k}, {Verb: store.Set, Key: k, Value: b}}
}

// who says who asked request r at key in user's box: with a prover, the uid its
// credential proves, which must be the box user's; without, the box's user. A request
// refused for its credential gets its answer (and an audit entry) here.
func (sv *server) who(ctx context.Context, key, user string, r Request, box boxed) (asker, *Answer, error) {
	if sv.prover == nil {
		return asker{user: user, by: "your token is " + user + "'s"}, nil, nil
	}
	var used asker // the credential, once it verified: marked used with the refusal
	deny := func(why string) (asker, *Answer, error) {
		sv.log.Warn("request refused", zap.String("key", key), zap.String("reason", why))
		err := audit.Write(ctx, sv.s, sealEntry(ctx, sv.prover, audit.Entry{User: "gangrun", Token: "agent", Action: audit.ActionRefuse,
			Target: "request " + key, Owner: user, Detail: why}))
		return used, &Answer{Error: "permission denied: " + why, Denied: true}, err
	}
	// Fresh: a request is carried out once, and munged's own replay cache refuses a
	// credential decoded here before; gangrun/batch/seen/ does across a fail-over.
	caller, err := sv.prover.Verify(ctx, box.Credential, requestContent(key, box.Request), identity.Fresh)
	if err != nil {
		if checkerTrouble(ctx, err) {
			return asker{}, nil, err // tried again: the request waits
		}
		return deny(requestWhy(err))
	}
	if e, err := sv.s.Get(ctx, seenPrefix+identity.Digest(box.Credential)); err != nil {
		return asker{}, nil, err
	} else if e != nil {
		return deny("replayed: the request's credential was used before")
	}
	used = asker{cred: box.Credential, caller: caller.UID, expires: caller.Expires()}
	name := userName(caller.UID)
	if name != user && caller.UID != 0 {
		return deny(fmt.Sprintf("the request is in %s's box, its MUNGE credential is uid %d's (%s)", user, caller.UID, name))
	}
	// Root asks in any box, as its user (root holding a user's token): root's powers
	// only in root's own.
	who := asker{user: user, root: user == "root" && caller.UID == 0, by: "your MUNGE credential is " + name + "'s", cred: box.Credential,
		uid: caller.UID, gid: caller.GID, caller: caller.UID, expires: caller.Expires()}
	if name != user {
		who.by = "your token is " + user + "'s" // root in another's box: a user token root holds
		if u, err := proc.LookupUser(user); err == nil {
			who.uid, who.gid = u.UID, u.GID // a job queued from the box runs as its user
		} else {
			return deny(fmt.Sprintf("the request is in %s's box, who has no account on the elected agent's node", user))
		}
	}
	return who, nil, nil
}

// requestWhy says why a request's credential was refused.
func requestWhy(err error) string {
	switch {
	case errors.Is(err, identity.ErrMissing):
		return "the request carries no MUNGE credential (is munged running where it was made? the agents check them)"
	case errors.Is(err, identity.ErrMismatch):
		return "the request's credential was made for another request (it was copied, or the request changed)"
	case errors.Is(err, identity.ErrInvalid):
		return "the request's credential is not of this cluster (another MUNGE key, or damaged)"
	case errors.Is(err, identity.ErrExpired):
		return "the request's credential has expired: " + err.Error()
	case errors.Is(err, identity.ErrReplayed):
		return "replayed: the request's credential was used before"
	}
	return "the request's credential: " + err.Error()
}

// do carries out request r for who: its answer, and operations to apply with it; a nil
// answer with no error means the request changed meanwhile (its next version is
// served). answer makes the operation that answers it (a check-and-set of the request).
func (sv *server) do(ctx context.Context, who asker, r Request, answer func(Answer) store.Op) (*Answer, []store.Op, error) {
	s, fence := sv.s, sv.fence
	var ans Answer
	switch r.Kind {
	case requestSubmit:
		if r.Spec == nil {
			return &Answer{Error: "a submit request without a job", Invalid: true}, nil, nil
		}
		spec := *r.Spec
		spec.User = who.user // the box says who asks, whatever the spec says
		// What the cluster decides is not the user's to say: the id, the array task
		// it would be, the submission time (the age factor counts from it).
		spec.ID, spec.Array, spec.Submitted = "", nil, time.Time{}
		if r.Array != nil {
			if err := r.Array.Validate(); err != nil {
				return &Answer{Error: err.Error(), Invalid: true}, nil, nil
			}
		}
		if err := CheckOperatorOnly(spec); err != nil && !who.root {
			return &Answer{Error: err.Error(), Invalid: true}, nil, nil
		}
		var auth authFor
		if who.cred != "" {
			auth = sv.accepted(who)
		}
		var err error
		also := func(id string) []store.Op {
			tasks := []string(nil)
			if r.Array != nil {
				tasks = make([]string, len(r.Array.Indices))
				for i, x := range r.Array.Indices {
					tasks[i] = TaskID(id, x)
				}
			}
			return []store.Op{fence, answer(Answer{ID: id, Tasks: tasks})}
		}
		if who.cred != "" {
			// The credential is used once, with the job it queues.
			also = func(also alsoOps) alsoOps {
				return func(id string) []store.Op {
					return append(also(id), seenOps(who.cred, "submit of job "+id, who.expires)...)
				}
			}(also)
		}
		if r.Array != nil {
			_, _, err = submitArray(ctx, s, spec, *r.Array, also, auth)
		} else {
			_, err = submit(ctx, s, spec, also, auth)
		}
		switch {
		case err == nil:
			return nil, nil, nil // answered in the submit's transaction
		case errors.Is(err, ErrInvalid):
			ans = Answer{Error: err.Error(), Invalid: true}
		case errors.Is(err, store.ErrTxnRejected) && !allocator.LostLeadership(err):
			return nil, nil, nil // the request changed meanwhile: its next version is served
		default:
			return nil, nil, err
		}
	case requestCancel:
		a, also, err := cancelFor(ctx, s, sv.prover, who, r.Job)
		if err != nil {
			return nil, nil, err
		}
		a.By = who.by
		return &a, append(also, refusedOps(ctx, sv.prover, who, audit.ActionCancel, "job "+r.Job, "", a)...), nil
	case requestHold:
		a, err := holdFor(ctx, s, sv.prover, who, r.Job, r.HoldOp)
		if err != nil {
			return nil, nil, err
		}
		a.By = who.by
		return &a, refusedOps(ctx, sv.prover, who, audit.ActionHold, "job "+r.Job, string(r.HoldOp), a), nil
	case requestUpdate:
		a, also, err := sv.updateFor(ctx, who, r.Job, r.Update)
		if err != nil {
			return nil, nil, err
		}
		a.By = who.by
		return &a, also, nil
	case requestSignal:
		a, err := signalFor(ctx, s, sv.prover, who, r.Job, syscall.Signal(r.Signal), r.Target)
		if err != nil {
			return nil, nil, err
		}
		a.By = who.by
		return &a, refusedOps(ctx, sv.prover, who, audit.ActionSignal, "job "+r.Job, signalDetail(syscall.Signal(r.Signal), r.Target), a), nil
	case requestDrain, requestResume, requestPolicy:
		return sv.operate(ctx, who, r)
	default:
		ans = Answer{Error: fmt.Sprintf("unknown request kind %q", r.Kind), Invalid: true}
	}
	return &ans, nil, nil
}

// refusedOps is the audit entry, detail "DETAIL: refused: WHY" (or "refused: WHY"), of
// a request for action on target (detail: what more to say) that answer a refuses: another user's job (Answer.Owner), or one the asker may
// not change (Answer.Denied); none for an answer that is no refusal.
func refusedOps(ctx context.Context, p Prover, who asker, action, target, detail string, a Answer) []store.Op {
	if a.Owner == "" && !a.Denied {
		return nil
	}
	why := "refused: " + a.Error
	if a.Owner != "" {
		why = "refused: the job is " + a.Owner + "'s (" + who.by + ")"
	}
	if detail != "" {
		why = detail + ": " + why // as an update's and an Actor's refusals: "release: refused: WHY"
	}
	return []store.Op{audit.Op(sealEntry(ctx, p, audit.Entry{User: who.user, Token: "munge", Action: action, Target: target,
		Owner: a.Owner, Detail: why}))}
}

// accepted is how the agent writes a job it queues from who's request: accepted at
// once, the request's credential kept and the attestation made for the job as queued.
func (sv *server) accepted(who asker) authFor {
	return func(ctx context.Context, spec Spec) (*Auth, error) {
		att, err := sv.prover.Seal(ctx, attestContent(spec, who.uid, who.gid, who.cred))
		if err != nil {
			return nil, fmt.Errorf("the attestation: %w", err)
		}
		return &Auth{Credential: who.cred, UID: who.uid, GID: who.gid, Attestation: att, Accepted: time.Now().UTC()}, nil
	}
}

// operate carries out an operator's request r (drain, resume, a policy change) for who,
// root only, with its audit entry in the same transaction.
func (sv *server) operate(ctx context.Context, who asker, r Request) (*Answer, []store.Op, error) {
	what := map[string]string{requestDrain: "draining a node", requestResume: "resuming a node", requestPolicy: "changing the policy"}[r.Kind]
	if !who.root {
		return &Answer{Error: fmt.Sprintf("permission denied: %s is root's (the operator's): %s", what, who.by), Denied: true}, nil, nil
	}
	entry := func(action, target, detail string) store.Op {
		return audit.Op(sealEntry(ctx, sv.prover, audit.Entry{User: who.user, Token: "munge", Action: action, Target: target, Detail: detail}))
	}
	switch r.Kind {
	case requestDrain, requestResume:
		if err := store.CheckSegment("node", r.Node); err != nil {
			return &Answer{Error: err.Error(), Invalid: true}, nil, nil
		}
		reason, action := strings.TrimSpace(r.Reason), audit.ActionResume
		if r.Kind == requestDrain {
			if err := allocator.CheckReason(r.Reason); err != nil {
				return &Answer{Error: err.Error(), Invalid: true}, nil, nil
			}
			action = audit.ActionDrain
		}
		ops, err := allocator.DrainOps(ctx, sv.s, r.Node, reason)
		if errors.Is(err, allocator.ErrNotFound) {
			return &Answer{Error: err.Error(), Invalid: true}, nil, nil
		}
		if errors.Is(err, schema.ErrNewer) {
			return &Answer{Error: err.Error()}, nil, nil
		}
		if err != nil {
			return nil, nil, err
		}
		return &Answer{}, append(ops, entry(action, "node "+r.Node, reason)), nil
	default:
		p, err := policy.Parse(r.Policy)
		if err != nil {
			return &Answer{Error: err.Error(), Invalid: true}, nil, nil
		}
		ops, detail, err := policy.SaveOps(p)
		if err != nil {
			return &Answer{Error: err.Error(), Invalid: true}, nil, nil
		}
		guard, err := policy.Guard(ctx, sv.s)
		if errors.Is(err, schema.ErrNewer) {
			return &Answer{Error: err.Error()}, nil, nil
		}
		if err != nil {
			return nil, nil, err
		}
		ops = append(guard, ops...)
		return &Answer{Detail: detail}, append(ops, entry(audit.ActionPolicySet, "policy", detail)), nil
	}
}

// holdFor does hold operation op on job id (or array id's tasks) for who: the job
// must be who's, unless who is root, whose hold is an operator's. Another user's
// job is audited (with the change).
func holdFor(ctx context.Context, s store.Store, p Prover, who asker, id string, op HoldOp) (Answer, error) {
	if checkID(id) != nil {
		return Answer{Error: fmt.Sprintf("no job %q", id), Invalid: true}, nil
	}
	if !slices.Contains([]HoldOp{OpHold, OpUHold, OpRelease, OpRequeue, OpRequeueHold}, op) {
		return Answer{Error: fmt.Sprintf("unknown hold operation %q", op), Invalid: true}, nil
	}
	owner, refused, err := ownerFor(ctx, s, who, id, "hold or release")
	if refused != nil || err != nil {
		return *refused, err
	}
	var also []store.Op
	if owner != who.user {
		also = append(also, audit.Op(sealEntry(ctx, p, audit.Entry{User: who.user, Token: "munge", Action: audit.ActionHold,
			Target: "job " + id, Owner: owner, Detail: string(op)})))
	}
	n, err := DoHold(ctx, s, id, op, who.root, also...)
	if err != nil {
		return jobAnswer(id, err)
	}
	return Answer{Held: n}, nil
}

// ownerFor is the user of job id (or of array id's tasks) for who's request to verb
// it, when who may: the job is who's, or who is root. Otherwise it is the answer that
// refuses it: another user's job (Answer.Owner), no job (Invalid), a record a newer
// gangrun wrote (to verb it with that gangrun). Errors: the store's.
func ownerFor(ctx context.Context, s store.Store, who asker, id, verb string) (string, *Answer, error) {
	tasks, err := Tasks(ctx, s, id)
	if err != nil {
		return "", &Answer{}, err
	}
	for _, t := range tasks {
		if t.Spec.User != who.user && !who.root {
			return "", &Answer{Owner: t.Spec.User}, nil
		}
	}
	if len(tasks) > 0 {
		return tasks[0].Spec.User, nil, nil
	}
	j, err := Read(ctx, s, id)
	switch {
	case errors.Is(err, ErrNotFound):
		return "", &Answer{Error: fmt.Sprintf("no job %q", id), Invalid: true}, nil
	case errors.Is(err, schema.ErrNewer):
		return "", &Answer{Error: err.Error() + ": " + verb + " it with that gangrun"}, nil
	case err != nil:
		return "", &Answer{}, err
	case j.Spec.User != who.user && !who.root:
		return "", &Answer{Owner: j.Spec.User}, nil
	}
	return j.Spec.User, nil, nil
}

// cancelFor cancels job id (or array id's tasks) for who when it is who's, or who is
// root: the answer, and an audit entry to write with it when root cancels another's.
func cancelFor(ctx context.Context, s store.Store, p Prover, who asker, id string) (Answer, []store.Op, error) {
	if checkID(id) != nil {
		return Answer{Error: fmt.Sprintf("no job %q", id), Invalid: true}, nil, nil
	}
	tasks, err := Tasks(ctx, s, id)
	if err != nil {
		return Answer{}, nil, err
	}
	auditOf := func(target, owner, detail string) []store.Op {
		if owner == who.user {
			return nil
		}
		return []store.Op{audit.Op(sealEntry(ctx, p, audit.Entry{User: who.user, Token: "munge", Action: audit.ActionCancel, Target: target, Owner: owner, Detail: detail}))}
	}
	if len(tasks) > 0 {
		for _, t := range tasks {
			if t.Spec.User != who.user && !who.root {
				return Answer{Owner: t.Spec.User, Array: true}, nil, nil
			}
		}
		n, err := CancelArray(ctx, s, id)
		if err != nil {
			return Answer{}, nil, err
		}
		return Answer{Cancelled: n, Array: true}, auditOf("job array "+id, tasks[0].Spec.User, fmt.Sprintf("%d task(s)", n)), nil
	}
	j, err := Read(ctx, s, id)
	if errors.Is(err, ErrNotFound) {
		return Answer{Error: fmt.Sprintf("no job %q", id), Invalid: true}, nil, nil
	}
	if errors.Is(err, schema.ErrNewer) {
		return Answer{Error: err.Error() + ": cancel it with that gangrun"}, nil, nil
	}
	if err != nil {
		return Answer{}, nil, err
	}
	if j.Spec.User != who.user && !who.root {
		return Answer{Owner: j.Spec.User}, nil, nil
	}
	changed, err := Cancel(ctx, s, id, auditOf("job "+id, j.Spec.User, "")...)
	if err != nil {
		return Answer{}, nil, err
	}
	n := 0
	if changed {
		n = 1
	}
	return Answer{Cancelled: n}, nil, nil
}
