package job

import (
	"context"
	"errors"
	"fmt"

	"github.com/gangrun/gangrun/audit"
	"github.com/gangrun/gangrun/internal/store"
)

// Actor is who cancels, holds or releases jobs directly, not through the elected
// agent's request box (requests.go): the operator's token, or anyone where Consul's
// ACLs are off and the cluster checks no MUNGE credentials. An action on another user's
// job is written to the audit log in the transaction that does it.
type Actor struct {
	// User is the Unix user acting: an action on a job of another user is audited.
	User string
	// Admin makes a hold an operator's (JobHeldAdmin), and lets it release one: root's
	// or an operator token's, as Slurm's operators.
	Admin bool
	// Entry is the audit entry of action on target, a job of owner's (detail: what
	// more to say); nil audits nothing.
	Entry func(action, target, owner, detail string) audit.Entry
}

// auditOp is the audit operation of action on target, owner's, when owner is not the
// actor; nil otherwise.
func (a Actor) auditOp(action, target, owner, detail string) []store.Op {
	if a.Entry == nil || owner == "" || owner == a.User {
		return nil
	}
	return []store.Op{audit.Op(a.Entry(action, target, owner, detail))}
}

// ownerOf is the user of job id, or of the tasks of job array id ("" when there is
// neither), and whether id is an array.
func ownerOf(ctx context.Context, s store.Store, id string) (string, bool) {
	if tasks, err := Tasks(ctx, s, id); err == nil && len(tasks) > 0 {
		return tasks[0].Spec.User, true
	}
	if j, err := Read(ctx, s, id); err == nil {
		return j.Spec.User, false
	}
	return "", false
}

// Cancel cancels job id, or every task of job array id, for a: it returns how many
// jobs it cancelled (0: they had ended or were ending) and whether id is an array.
// Errors: ErrNotFound (no such job: an id of `gangrun alloc`'s, maybe), store errors.
func (a Actor) Cancel(ctx context.Context, s store.Store, id string) (int, bool, error) {
	owner, _ := ownerOf(ctx, s, id)
	if n, err := CancelArray(ctx, s, id); !errors.Is(err, ErrNotFound) {
		if err == nil && n > 0 && a.auditOp(audit.ActionCancel, "", owner, "") != nil {
			// An array's tasks are cancelled one by one: one entry for them all, after.
			err = audit.Write(ctx, s, a.Entry(audit.ActionCancel, "job array "+id, owner, fmt.Sprintf("%d task(s)", n)))
		}
		return n, true, err
	}
	changed, err := Cancel(ctx, s, id, a.auditOp(audit.ActionCancel, "job "+id, owner, "")...)
	if changed {
		return 1, false, err
	}
	return 0, false, err
}

// Hold does op (scontrol hold, uhold, release) on job id, or every task of job array
// id, for a (DoHold); errors as DoHold's.
func (a Actor) Hold(ctx context.Context, s store.Store, id string, op HoldOp) (int, error) {
	owner, _ := ownerOf(ctx, s, id)
	n, err := DoHold(ctx, s, id, op, a.Admin, a.auditOp(audit.ActionHold, "job "+id, owner, string(op))...)
	if errors.Is(err, ErrHeldByOperator) && a.Entry != nil {
		// Refused: written all the same, as the request box's refusals are.
		e := a.Entry(audit.ActionHold, "job "+id, owner, string(op)+": refused: "+ErrHeldByOperator.Error())
		if werr := audit.Write(ctx, s, e); werr != nil {
			return n, fmt.Errorf("%w (and its audit entry: %v)", err, werr)
		}
	}
	return n, err
}
