package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gangrun/gangrun/internal/userfile"
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
// Errors: keep below 1; the errors of List; a *DirError for an unreadable or malformed
// pin file, or a link (or anything but a directory) at .gangrun, .gangrun/pins or
// .gangrun/trash (which checkpoint a pin protects cannot be known, or where Apply would
// move checkpoints is not inside dir: nothing is planned).
func Prune(dir string, keep int, opts Options) (Plan, error) {
	if keep < 1 {
		return Plan{}, fmt.Errorf("prune %s: keep %d: must be at least 1 (the newest complete checkpoint is what a restart resumes from)", dir, keep)
	}
	s, err := newScan(dir, opts)
	if err != nil {
		return Plan{}, err
	}
	if len(s.pins.bad) > 0 {
		return Plan{}, &DirError{Path: dir, Problem: "cannot tell which checkpoints are pinned: " + s.pins.bad[0] +
			"; prune deletes nothing until it is removed (by hand, once no job holds it)"}
	}
	if err := checkTrash(dir); err != nil {
		return Plan{}, &DirError{Path: dir, Problem: stateErr(err) + "; prune deletes nothing until it is removed", Err: err}
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

// checkTrash returns an error when dir's .gangrun/trash exists and is not a directory
// (a symbolic link to elsewhere, say): Plan.Apply would refuse to use it.
func checkTrash(dir string) error {
	st, err := openState(dir, false)
	if isMissing(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer st.close()
	t, err := st.sub(trashDirName, false)
	if isMissing(err) {
		return nil
	}
	if err != nil {
		return err
	}
	t.Close()
	return nil
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
// Every step goes through descriptors opened once (DIR, then .gangrun and trash inside
// it without following a link) and single names relative to them, never a path
// resolved again: a symbolic link at .gangrun or trash is refused, a checkpoint swapped
// for a link is moved and removed as the link, and a link anywhere in a tree being
// deleted is removed, not followed (userfile.Dir.RemoveAll). Nothing outside DIR is
// ever deleted.
//
// Errors (joined): the directory cannot be read or changed under the plan (also: DIR
// now names another directory than the one listed, or .gangrun or its trash is a link);
// ctx done; a checkpoint pinned since the plan (errors.Is(err, ErrPinned); it is kept);
// a failed rename or removal.
func (p Plan) ApplyContext(ctx context.Context) error {
	if len(p.Delete) == 0 && len(p.stalePins) == 0 {
		return nil
	}
	root, err := userfile.OpenDirFD(p.Dir)
	if err != nil {
		return &DirError{Path: p.Dir, Problem: "nothing deleted: " + stateErr(err), Err: err}
	}
	defer root.Close()
	s, err := newScan(p.Dir, Options{Format: p.format})
	if err != nil {
		return err
	}
	if !root.SameAs(p.Dir) {
		return fmt.Errorf("prune %s: the directory changed since the plan: the path now names another directory; nothing deleted", p.Dir)
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
	sd, err := root.MkSub(stateDirName, 0o755)
	if err != nil {
		return fmt.Errorf("prune %s: nothing deleted: %w", p.Dir, err)
	}
	st := &stateDir{root: root, dir: sd}
	defer sd.Close()
	var errs []error
	if len(p.Delete) > 0 {
		trash, err := st.sub(trashDirName, true)
		if err != nil {
			return fmt.Errorf("prune %s: nothing deleted: %w", p.Dir, err)
		}
		defer trash.Close()
		if left, err := trash.Entries(); err == nil {
			for _, e := range left { // leftovers of an interrupted Apply
				_ = trash.RemoveAll(e.Name())
			}
		}
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
			moved, err := moveAside(ctx, st, p.Dir, name, trash)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if moved != "" {
				if err := trash.RemoveAll(moved); err != nil {
					errs = append(errs, fmt.Errorf("prune %s: delete %s (moved to %s): %w", p.Dir, d.Path, trash.Join(moved), err))
				}
			}
		}
	}
	if err := removeStalePins(ctx, st, p.Dir, p.stalePins); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// moveAside renames DIR/name into trash under the directory lock, unless a live pin
// holds it, both through descriptors (a link at name is moved as the link). It returns
// the name in trash, or "" when name no longer exists.
func moveAside(ctx context.Context, st *stateDir, dir, name string, trash *userfile.Dir) (string, error) {
	unlock, err := lockDir(ctx, st)
	if err != nil {
		return "", fmt.Errorf("prune %s: %w", dir, err)
	}
	defer unlock()
	ps := readPins(dir, localHost())
	if len(ps.bad) > 0 {
		return "", fmt.Errorf("prune %s: %s not deleted: pin not read: %s", dir, name, ps.bad[0])
	}
	if holder, ok := ps.holder(name); ok {
		return "", fmt.Errorf("prune %s: %s %w by %s: kept", dir, name, ErrPinned, holder.describe())
	}
	if _, err := st.root.Lstat(name); err != nil {
		if isNotExist(err) {
			return "", nil
		}
		return "", fmt.Errorf("prune %s: %w", dir, err)
	}
	dst := name + "." + randomHex(4)
	if err := st.root.Rename(name, trash, dst); err != nil {
		return "", fmt.Errorf("prune %s: move %s aside: %w", dir, name, err)
	}
	return dst, nil
}

// removeStalePins removes the given pin files when they are still stale.
func removeStalePins(ctx context.Context, st *stateDir, dir string, files []string) error {
	if len(files) == 0 {
		return nil
	}
	unlock, err := lockDir(ctx, st)
	if err != nil {
		return fmt.Errorf("prune %s: %w", dir, err)
	}
	defer unlock()
	ps := readPins(dir, localHost())
	stale := map[string]string{}
	for _, p := range ps.stale {
		stale[p.file] = p.name
	}
	pins, err := st.sub(pinsDirName, false)
	if isMissing(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("prune %s: %w", dir, err)
	}
	defer pins.Close()
	var errs []error
	for _, f := range files {
		name, ok := stale[f]
		if !ok {
			continue
		}
		if err := pins.Remove(name); err != nil {
			errs = append(errs, fmt.Errorf("prune %s: remove stale pin: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}
