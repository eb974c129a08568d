package job

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/gangrun/gangrun/acl"
	"github.com/gangrun/gangrun/allocator"
	"github.com/gangrun/gangrun/internal/store"
)

// A user's requests, when Consul's ACLs are on (docs/acl.md). A user's token may write
// only gangrun/batch/users/<user>/ (acl.UserRules); `gangrun submit` and `gangrun
// cancel` under such a token write a Request there and wait for its Answer, which the
// elected agent writes (ServeRequests): the key's place is the proof of who asks.
//
//	gangrun/batch/users/<user>/<kind>-<nanos>-<rand>   Request; kind submit or cancel
//
// A submit's job is queued in the transaction that writes its answer (a check-and-set
// of the request), so a request is carried out once or not at all; the asker deletes
// the request once answered, or, with a check-and-set, when it gives up waiting (then
// nothing was done). Answered requests left behind are deleted after requestKeep.

// Request kinds.
const (
	requestSubmit = "submit"
	requestCancel = "cancel"
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
	// Job is a cancel's job id (or an array's).
	Job string `json:"job,omitempty"`
	// Answer is the elected agent's, nil until it answers.
	Answer *Answer `json:"answer,omitempty"`
}

// Answer is the elected agent's answer to a Request.
type Answer struct {
	At time.Time `json:"at"`
	// ID and Tasks are a submitted job's id and an array's task ids.
	ID    string   `json:"id,omitempty"`
	Tasks []string `json:"tasks,omitempty"`
	// Cancelled counts the jobs a cancel cancelled (0: they had ended or were ending).
	Cancelled int `json:"cancelled,omitempty"`
	// Array says the cancel was of a job array's tasks.
	Array bool `json:"array,omitempty"`
	// Error is why it was not done; Invalid marks the user's error (a bad spec, an
	// unknown job), Owner the job's user when it is another's.
	Error   string `json:"error,omitempty"`
	Invalid bool   `json:"invalid,omitempty"`
	Owner   string `json:"owner,omitempty"`
}

// ErrNotYours marks a cancel of another user's job under a user's token.
var ErrNotYours = errors.New("permission denied")

// NotYoursError is a cancel refused because job ID is Owner's, not User's.
type NotYoursError struct {
	ID, Owner, User string
}

func (e *NotYoursError) Error() string {
	return fmt.Sprintf("permission denied: job %s belongs to %s (your token is %s's)", e.ID, e.Owner, e.User)
}

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
func ask(ctx context.Context, s store.Store, user string, r Request, wait time.Duration) (*Answer, error) {
	key := requestKey(user, r.Kind)
	b, _ := json.Marshal(r)
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
					return withdraw(context.WithoutCancel(ctx), s, key, ctx.Err())
				}
				return nil, err
			}
			index = idx
			for _, e := range entries {
				if e.Key != key {
					continue
				}
				var got Request
				if json.Unmarshal(e.Value, &got) == nil && got.Answer != nil {
					_, _ = s.Txn(ctx, []store.Op{{Verb: store.Delete, Key: key}})
					return got.Answer, nil
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
			var got Request
			if json.Unmarshal(e.Value, &got) == nil && got.Answer != nil {
				_, _ = s.Txn(ctx, []store.Op{{Verb: store.Delete, Key: key}})
				return got.Answer, nil
			}
			if _, err := s.Txn(ctx, []store.Op{{Verb: store.DeleteCAS, Key: key, Index: e.ModifyIndex}}); errors.Is(err, store.ErrTxnRejected) {
				continue // answered meanwhile
			}
		}
		return nil, fmt.Errorf("%w within %s: no elected gangrun agent answered; nothing was done", ErrNoAnswer, wait)
	}
}

// withdraw takes back the unanswered request at key after why stopped its asker: its
// answer when it was answered meanwhile, else why, wrapped to say nothing was done (or
// that the request may stand, when it could not be removed).
func withdraw(ctx context.Context, s store.Store, key string, why error) (*Answer, error) {
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
		var got Request
		if json.Unmarshal(e.Value, &got) == nil && got.Answer != nil {
			_, _ = s.Txn(ctx, []store.Op{{Verb: store.Delete, Key: key}})
			return got.Answer, nil
		}
		if _, err := s.Txn(ctx, []store.Op{{Verb: store.DeleteCAS, Key: key, Index: e.ModifyIndex}}); err == nil {
			return nil, fmt.Errorf("stopped (%w): the request was withdrawn; nothing was done", why)
		}
	}
	return nil, fmt.Errorf("stopped (%w) and could not withdraw the request %s: it may still be carried out", why, key)
}

// SubmitAs submits spec (an array's tasks when a is not nil) as user through the
// user's request box: what a user's token, which may write nothing else, does. The
// job's user is user whatever spec says. Errors as Submit's (ErrInvalid for the user's
// mistakes), and ErrNoAnswer when no elected agent answered within wait.
func SubmitAs(ctx context.Context, s store.Store, user string, spec Spec, a *Array, wait time.Duration) (string, []string, error) {
	spec.User = user
	ans, err := ask(ctx, s, user, Request{Kind: requestSubmit, Spec: &spec, Array: a}, wait)
	if err != nil {
		return "", nil, err
	}
	if ans.Error != "" {
		if ans.Invalid {
			return "", nil, &invalid{errors.New(ans.Error)}
		}
		return "", nil, errors.New(ans.Error)
	}
	return ans.ID, ans.Tasks, nil
}

// CancelAs cancels job id (or every task of job array id) as user through the user's
// request box, when the job is user's: it returns how many jobs it cancelled (0: they
// had ended or were ending) and whether id is an array. Errors: *NotYoursError
// (ErrNotYours) for another's job, ErrNotFound, ErrNoAnswer.
func CancelAs(ctx context.Context, s store.Store, user, id string, wait time.Duration) (int, bool, error) {
	ans, err := ask(ctx, s, user, Request{Kind: requestCancel, Job: id}, wait)
	if err != nil {
		return 0, false, err
	}
	switch {
	case ans.Owner != "":
		return 0, ans.Array, &NotYoursError{ID: id, Owner: ans.Owner, User: user}
	case ans.Invalid:
		return 0, false, fmt.Errorf("job %s: %w", id, ErrNotFound)
	case ans.Error != "":
		return 0, ans.Array, errors.New(ans.Error)
	}
	return ans.Cancelled, ans.Array, nil
}

// ServeRequests returns the elected agent's server of users' requests, the signature
// allocator.AgentConfig.Leader takes: it follows gangrun/batch/users/ and carries out
// each request not yet answered, as the user whose box it is in, every write fenced by
// the leader's session: a submit queues the job as that user's (with its answer, in one
// transaction); a cancel cancels the job if it is that user's, and answers with its
// owner if not.
func ServeRequests(log *zap.Logger) func(ctx context.Context, s store.Store, session string) error {
	if log == nil {
		log = zap.NewNop()
	}
	return func(ctx context.Context, s store.Store, session string) error {
		fence := allocator.LeaderFence(session)
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
			for _, e := range answers[0].Entries {
				err := serve(ctx, s, fence, e)
				switch {
				case ctx.Err() != nil:
					return nil
				case errors.Is(err, store.ErrNotLockHolder):
					return err // no longer the leader
				case err != nil:
					log.Warn("users' requests", zap.String("key", e.Key), zap.Error(err))
				}
			}
		}
	}
}

// serve carries out the request at e, if it is one not yet answered; an answered one
// older than requestKeep is deleted.
func serve(ctx context.Context, s store.Store, fence store.Op, e store.Entry) error {
	user, name, _ := strings.Cut(strings.TrimPrefix(e.Key, acl.UsersPrefix), "/")
	var r Request
	if acl.CheckUser(user) != nil || strings.Contains(name, "/") || json.Unmarshal(e.Value, &r) != nil {
		return nil // not a request: left alone
	}
	if r.Answer != nil {
		if time.Since(r.Answer.At) > requestKeep {
			_, err := s.Txn(ctx, []store.Op{fence, {Verb: store.DeleteCAS, Key: e.Key, Index: e.ModifyIndex}})
			if errors.Is(err, store.ErrTxnRejected) && !errors.Is(err, store.ErrNotLockHolder) {
				return nil
			}
			return err
		}
		return nil
	}
	answer := func(a Answer) store.Op {
		a.At = time.Now().UTC()
		r.Answer = &a
		b, _ := json.Marshal(r)
		return store.Op{Verb: store.CAS, Key: e.Key, Value: b, Index: e.ModifyIndex}
	}
	var ans Answer
	switch r.Kind {
	case requestSubmit:
		if r.Spec == nil {
			ans = Answer{Error: "a submit request without a job", Invalid: true}
			break
		}
		spec := *r.Spec
		spec.User = user // the box says who asks, whatever the spec says
		// What the cluster decides is not the user's to say: the id, the array task
		// it would be, the submission time (the age factor counts from it).
		spec.ID, spec.Array, spec.Submitted = "", nil, time.Time{}
		if spec.Priority > 0 {
			// As in Slurm, raising a job's priority is an operator's (sbatch --priority).
			ans = Answer{Error: fmt.Sprintf("--priority %d: only an operator may raise a job's priority", spec.Priority), Invalid: true}
			break
		}
		var err error
		if r.Array != nil {
			_, _, err = submitArray(ctx, s, spec, *r.Array, func(id string) []store.Op {
				tasks := make([]string, len(r.Array.Indices))
				for i, x := range r.Array.Indices {
					tasks[i] = TaskID(id, x)
				}
				return []store.Op{fence, answer(Answer{ID: id, Tasks: tasks})}
			})
		} else {
			_, err = submit(ctx, s, spec, func(id string) []store.Op { return []store.Op{fence, answer(Answer{ID: id})} })
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, ErrInvalid):
			ans = Answer{Error: err.Error(), Invalid: true}
		case errors.Is(err, store.ErrTxnRejected) && !errors.Is(err, store.ErrNotLockHolder):
			return nil // the request changed meanwhile: its next version is served
		default:
			return err
		}
	case requestCancel:
		var err error
		ans, err = cancelFor(ctx, s, user, r.Job)
		if err != nil {
			return err
		}
	default:
		ans = Answer{Error: fmt.Sprintf("unknown request kind %q", r.Kind), Invalid: true}
	}
	_, err := s.Txn(ctx, []store.Op{fence, answer(ans)})
	if errors.Is(err, store.ErrTxnRejected) && !errors.Is(err, store.ErrNotLockHolder) {
		return nil
	}
	return err
}

// cancelFor cancels job id (or array id's tasks) for user when it is user's.
func cancelFor(ctx context.Context, s store.Store, user, id string) (Answer, error) {
	if checkID(id) != nil {
		return Answer{Error: fmt.Sprintf("no job %q", id), Invalid: true}, nil
	}
	tasks, err := Tasks(ctx, s, id)
	if err != nil {
		return Answer{}, err
	}
	if len(tasks) > 0 {
		for _, t := range tasks {
			if t.Spec.User != user {
				return Answer{Owner: t.Spec.User, Array: true}, nil
			}
		}
		n, err := CancelArray(ctx, s, id)
		if err != nil {
			return Answer{}, err
		}
		return Answer{Cancelled: n, Array: true}, nil
	}
	j, err := Read(ctx, s, id)
	if errors.Is(err, ErrNotFound) {
		return Answer{Error: fmt.Sprintf("no job %q", id), Invalid: true}, nil
	}
	if err != nil {
		return Answer{}, err
	}
	if j.Spec.User != user {
		return Answer{Owner: j.Spec.User}, nil
	}
	changed, err := Cancel(ctx, s, id)
	if err != nil {
		return Answer{}, err
	}
	n := 0
	if changed {
		n = 1
	}
	return Answer{Cancelled: n}, nil
}
