package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// trashDirName is where Plan.Apply moves a checkpoint (an atomic rename inside the
// checkpoint directory) before deleting it, so that no reader ever sees a half-deleted
// checkpoint under its real name.
const trashDirName = "trash"

// ErrPinned is wrapped by Plan.Apply's error when a checkpoint the plan would delete
// was pinned after the plan was made; that checkpoint is kept.
var ErrPinned = errors.New("pinned since the plan was made")

// Decision is one checkpoint of a Plan with why it is deleted or kept.
type Decision struct {
	Checkpoint
	// Why says why the plan deletes or keeps the checkpoint.
	Why string `json:"why"`
}

// Plan is what Prune would delete and keep, newest first. Apply carries it out.
type Plan struct {
	// Dir is the checkpoint directory as given to Prune.
	Dir string `json:"dir"`
	// Keep is how many of the newest complete checkpoints are kept.
	Keep int `json:"keep"`
	// Delete lists the checkpoints Apply deletes.
	Delete []Decision `json:"delete"`
	// Kept lists the checkpoints left alone.
	Kept []Decision `json:"kept"`
	// Notes are the directory-level findings (see Listing.Notes).
	Notes []string `json:"notes,omitempty"`

	format Format
	// stalePins are the pin files Apply removes.
	stalePins []string
}

// Prune plans retention in dir: it keeps the newest keep complete checkpoints and
// deletes older complete ones, and never deletes
//   - a checkpoint a live pin holds (the one a running job resumed from, see Pin);
//   - an incomplete checkpoint newer than the newest complete one (it may still be
//     being written), or any incomplete one when none is complete;
//   - a symlink, the target of a symlink candidate (Lightning's last.ckpt), or the
//     target of a pointer file (DeepSpeed's latest, Megatron's tracker).
//
// Incomplete checkpoints older than the newest complete one are deleted: they are what
// interrupted saves left behind. opts.Exclude is ignored. Prune deletes nothing; see
// Plan.Apply.
//
// Errors: keep below 1; the errors of List; an unreadable pin file (which checkpoint it
// protects cannot be known, so nothing is planned).
func Prune(dir string, keep int, opts Options) (Plan, error) {
	if keep < 1 {
		return Plan{}, fmt.Errorf("prune %s: keep %d: must be at least 1 (the newest complete checkpoint is what a restart resumes from)", dir, keep)
	}
	s, err := newScan(dir, opts)
	if err != nil {
		return Plan{}, err
	}
	if len(s.pins.bad) > 0 {
		return Plan{}, fmt.Errorf("prune %s: unreadable pin %s: remove it by hand if no job holds it", dir, s.pins.bad[0])
	}
	plan := Plan{Dir: dir, Keep: keep, Notes: s.notes, format: opts.Format, Delete: []Decision{}, Kept: []Decision{}}
	for _, p := range s.pins.stale {
		plan.stalePins = append(plan.stalePins, p.file)
	}
	cps := make([]Checkpoint, len(s.cands))
	newestComplete := -1
	linkedBy := map[string]string{}
	for i, c := range s.cands {
		cps[i] = s.evaluate(c)
		s.fill(&cps[i], c, true)
		if cps[i].Complete && newestComplete < 0 {
			newestComplete = i
		}
		if t := linkTargetName(dir, cps[i].Link); t != "" {
			linkedBy[t] = c.name
		}
	}
	pointedBy := map[string]string{}
	for _, p := range s.pointers {
		if p.target != "" {
			pointedBy[p.target] = p.file
		}
	}
	kept := 0
	for i, c := range s.cands {
		cp := cps[i]
		holder, pinned := s.pins.holder(c.name)
		var why string
		del := false
		switch {
		case cp.Link != "":
			why = "symlink to " + cp.Link + ": prune deletes no links"
		case cp.Complete && kept < keep:
			kept++
			why = fmt.Sprintf("one of the newest %d complete", keep)
			if pinned {
				why += "; pinned by " + holder.describe()
			}
		case pinned:
			why = "pinned by " + holder.describe()
		case linkedBy[c.name] != "":
			why = "target of symlink " + linkedBy[c.name]
		case pointedBy[c.name] != "":
			why = "named by " + pointedBy[c.name]
		case c.badStep != "":
			// Without a step there is no telling whether it is older or newer than the
			// checkpoints kept: deleting it could delete the newest one.
			why = c.badStep + ": its place among the checkpoints is unknown, so it is kept"
		case cp.Complete:
			del = true
			why = fmt.Sprintf("complete, older than the newest %d complete", keep)
		case newestComplete < 0:
			why = "incomplete, and no checkpoint is complete: it may still be being written"
		case i < newestComplete:
			why = "incomplete, newer than the newest complete checkpoint: it may still be being written"
		default:
			del = true
			why = "incomplete, older than the newest complete checkpoint " + filepath.Base(cps[newestComplete].Path) + ": left by an interrupted save"
		}
		d := Decision{Checkpoint: cp, Why: why}
		if del {
			plan.Delete = append(plan.Delete, d)
		} else {
			plan.Kept = append(plan.Kept, d)
		}
	}
	return plan, nil
}

// linkTargetName returns the name of the sibling a symlink target names, or "".
func linkTargetName(dir, target string) string {
	if target == "" {
		return ""
	}
	if !filepath.IsAbs(target) {
		if strings.ContainsRune(filepath.Clean(target), filepath.Separator) {
			return ""
		}
		return filepath.Clean(target)
	}
	absDir, err := filepath.Abs(dir)
	if err != nil || filepath.Dir(target) != absDir {
		return ""
	}
	return filepath.Base(target)
}

// Apply deletes the plan's checkpoints; it is ApplyContext without a deadline.
func (p Plan) Apply() error { return p.ApplyContext(context.Background()) }

// ApplyContext deletes the plan's checkpoints, newest first, and removes the stale pin
// files the plan found. Before anything it checks that the directory's newest complete
// checkpoint is not among the deletions (the directory may have changed since the
// plan); then, for each checkpoint, under the lock Pin takes, it re-reads the pins,
// skips the checkpoint if one now holds it, and renames it into DIR/.gangrun/trash;
// then it deletes the moved tree outside the lock. It deletes only names that are
// still candidates of the directory, so a hand-built Plan cannot reach outside it.
//
// Errors (joined): the directory cannot be read or changed under the plan; ctx done;
// a checkpoint pinned since the plan (errors.Is(err, ErrPinned); it is kept); a failed
// rename or removal.
func (p Plan) ApplyContext(ctx context.Context) error {
	if len(p.Delete) == 0 && len(p.stalePins) == 0 {
		return nil
	}
	s, err := newScan(p.Dir, Options{Format: p.format})
	if err != nil {
		return err
	}
	doomed := map[string]bool{}
	for _, d := range p.Delete {
		doomed[filepath.Base(d.Path)] = true
	}
	latest, err := Latest(p.Dir, Options{Format: p.format})
	switch {
	case errors.Is(err, ErrNoComplete):
		return fmt.Errorf("prune %s: the directory changed since the plan: no checkpoint is complete now; nothing deleted", p.Dir)
	case err != nil:
		return err
	case doomed[filepath.Base(latest.Path)]:
		return fmt.Errorf("prune %s: the directory changed since the plan: %s, which the plan deletes, is now the newest complete checkpoint; nothing deleted", p.Dir, latest.Path)
	}
	trash := filepath.Join(p.Dir, stateDirName, trashDirName)
	if err := os.MkdirAll(trash, 0o755); err != nil {
		return fmt.Errorf("prune %s: %w", p.Dir, err)
	}
	if left, err := os.ReadDir(trash); err == nil {
		for _, e := range left { // leftovers of an interrupted Apply
			_ = os.RemoveAll(filepath.Join(trash, e.Name()))
		}
	}
	var errs []error
	for _, d := range p.Delete {
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("prune %s: %w", p.Dir, err))
			break
		}
		name := filepath.Base(d.Path)
		if s.byName[name] == nil || filepath.Join(p.Dir, name) != d.Path {
			errs = append(errs, fmt.Errorf("prune %s: %s is not a checkpoint of this directory; not deleted", p.Dir, d.Path))
			continue
		}
		moved, err := moveAside(ctx, p.Dir, name, trash)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if moved != "" {
			if err := os.RemoveAll(moved); err != nil {
				errs = append(errs, fmt.Errorf("prune %s: delete %s (moved to %s): %w", p.Dir, d.Path, moved, err))
			}
		}
	}
	if err := removeStalePins(ctx, p.Dir, p.stalePins); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// moveAside renames DIR/name into trash under the directory lock, unless a live pin
// holds it. It returns the new path, or "" when name no longer exists.
func moveAside(ctx context.Context, dir, name, trash string) (string, error) {
	unlock, err := lockDir(ctx, dir)
	if err != nil {
		return "", fmt.Errorf("prune %s: %w", dir, err)
	}
	defer unlock()
	ps := readPins(dir, localHost())
	if len(ps.bad) > 0 {
		return "", fmt.Errorf("prune %s: %s not deleted: unreadable pin %s", dir, name, ps.bad[0])
	}
	if holder, ok := ps.holder(name); ok {
		return "", fmt.Errorf("prune %s: %s %w by %s: kept", dir, name, ErrPinned, holder.describe())
	}
	src := filepath.Join(dir, name)
	if _, err := os.Lstat(src); err != nil {
		if isNotExist(err) {
			return "", nil
		}
		return "", fmt.Errorf("prune %s: %s: %w", dir, name, err)
	}
	dst := filepath.Join(trash, name+"."+randomHex(4))
	if err := os.Rename(src, dst); err != nil {
		return "", fmt.Errorf("prune %s: move %s aside: %w", dir, name, err)
	}
	return dst, nil
}

// removeStalePins removes the given pin files when they are still stale.
func removeStalePins(ctx context.Context, dir string, files []string) error {
	if len(files) == 0 {
		return nil
	}
	unlock, err := lockDir(ctx, dir)
	if err != nil {
		return fmt.Errorf("prune %s: %w", dir, err)
	}
	defer unlock()
	ps := readPins(dir, localHost())
	stale := map[string]bool{}
	for _, p := range ps.stale {
		stale[p.file] = true
	}
	var errs []error
	for _, f := range files {
		if !stale[f] {
			continue
		}
		if err := os.Remove(f); err != nil && !isNotExist(err) {
			errs = append(errs, fmt.Errorf("prune %s: remove stale pin %s: %w", dir, f, err))
		}
	}
	return errors.Join(errs...)
}
