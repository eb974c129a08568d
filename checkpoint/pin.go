package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"
)

// Pins live in DIR/.gangrun/pins/, one JSON file per pin, so that a separate process
// (`gangrun ckpt prune`) sees them. A pin is live until its holder releases it; a pin
// becomes stale — and is ignored, then removed by Plan.Apply — when it was written on
// this host and its process is gone: the host rebooted since (its boot id changed),
// the pid no longer exists, or the pid now belongs to a process that started at
// another time (pid reuse; the start time is field 22 of /proc/PID/stat). A pin
// written on another host cannot be checked from here and stays live until released.
const (
	// stateDirName is gangrun's directory inside a checkpoint directory; its leading
	// dot keeps it out of every candidate pattern.
	stateDirName = ".gangrun"
	pinsDirName  = "pins"
	pinPrefix    = "pin-"
	pinSuffix    = ".json"
	lockFileName = "lock"
	// pinLockTimeout bounds how long Pin waits for a concurrent Plan.Apply to finish
	// moving one checkpoint aside.
	pinLockTimeout = 30 * time.Second
)

// pinRecord is the content of one pin file.
type pinRecord struct {
	// Checkpoint is the pinned candidate's name inside the checkpoint directory.
	Checkpoint string `json:"checkpoint"`
	// Holder is the job that pinned it (the supervisor's job id).
	Holder string `json:"holder"`
	// Host is the pinning process's host name.
	Host string `json:"host"`
	// PID is the pinning process's id.
	PID int `json:"pid"`
	// PIDStartTicks is the pinning process's start time, in clock ticks after boot
	// (/proc/PID/stat field 22); 0 when unknown.
	PIDStartTicks uint64 `json:"pid_start_ticks,omitempty"`
	// BootID is /proc/sys/kernel/random/boot_id at pin time; "" when unknown.
	BootID string `json:"boot_id,omitempty"`
	// Created is when the pin was written.
	Created time.Time `json:"created"`

	// file is the pin file's path, name its name in the pins directory; stale (why it
	// is) is decided on reading.
	file  string
	name  string
	stale string
}

// describe names the holder of a pin for messages.
func (p pinRecord) describe() string {
	return fmt.Sprintf("job %s (pid %d on %s, since %s)", p.Holder, p.PID, p.Host, p.Created.Format(time.RFC3339))
}

// pinSet is the pins read from a directory.
type pinSet struct {
	live  []pinRecord
	stale []pinRecord
	// bad lists pin files that could not be read or parsed.
	bad []string
}

// holds reports whether a live pin holds the candidate named name.
func (ps pinSet) holds(name string) bool {
	_, ok := ps.holder(name)
	return ok
}

// holder returns the first live pin holding name.
func (ps pinSet) holder(name string) (pinRecord, bool) {
	for _, p := range ps.live {
		if p.Checkpoint == name {
			return p, true
		}
	}
	return pinRecord{}, false
}

// loadPins reads dir's pins and appends notes for stale and unreadable ones.
func loadPins(dir string, notes []string) (pinSet, []string) {
	ps := readPins(dir, localHost())
	for _, p := range ps.stale {
		notes = append(notes, fmt.Sprintf("stale pin on %s by %s ignored: %s", p.Checkpoint, p.describe(), p.stale))
	}
	for _, b := range ps.bad {
		notes = append(notes, "pin not read: "+b)
	}
	return ps, notes
}

// host is what staleness checks compare against.
type host struct {
	name   string
	bootID string
}

func localHost() host {
	name, _ := os.Hostname()
	return host{name: name, bootID: bootID()}
}

func bootID() string {
	data, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// readPins reads every pin file of dir, deciding staleness against h. Everything is
// reached through a stateDir: a link at .gangrun, at pins or at a pin's name, and a pin
// that is a FIFO, a device or longer than maxPinBytes, are bad pins (named in ps.bad),
// never followed nor waited on; so is a record that gangrun did not write (malformed).
func readPins(dir string, h host) pinSet {
	var ps pinSet
	st, err := openState(dir, false)
	if err != nil {
		if !isMissing(err) {
			ps.bad = append(ps.bad, stateErr(err))
		}
		return ps
	}
	defer st.close()
	pins, err := st.sub(pinsDirName, false)
	if err != nil {
		if !isMissing(err) {
			ps.bad = append(ps.bad, stateErr(err))
		}
		return ps
	}
	defer pins.Close()
	entries, err := pins.Entries()
	if err != nil {
		ps.bad = append(ps.bad, stateErr(err))
		return ps
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, pinPrefix) || !strings.HasSuffix(name, pinSuffix) {
			continue
		}
		file := pins.Join(name)
		data, err := pins.ReadFile(name, maxPinBytes)
		if err != nil {
			if isMissing(err) { // released while listing
				continue
			}
			ps.bad = append(ps.bad, stateErr(err))
			continue
		}
		var p pinRecord
		if err := json.Unmarshal(data, &p); err != nil {
			ps.bad = append(ps.bad, fmt.Sprintf("%s: not a pin record (not JSON)", file))
			continue
		}
		if why := p.malformed(); why != "" {
			ps.bad = append(ps.bad, fmt.Sprintf("%s: malformed pin (%s): gangrun writes none such", file, why))
			continue
		}
		p.file, p.name = file, name
		if why := staleness(p, h); why != "" {
			p.stale = why
			ps.stale = append(ps.stale, p)
			continue
		}
		ps.live = append(ps.live, p)
	}
	sort.Strings(ps.bad)
	return ps
}

// malformed says why p cannot be a pin gangrun wrote (Pin fills every field but the
// optional ones), or "" when it could be. A malformed pin holds nothing: it is a bad
// pin, which List notes and Prune refuses to work around.
func (p pinRecord) malformed() string {
	switch {
	case p.Checkpoint == "" || strings.ContainsRune(p.Checkpoint, '/') || p.Checkpoint == "." || p.Checkpoint == "..":
		return fmt.Sprintf("checkpoint %q is not a name inside the directory", clip(p.Checkpoint))
	case p.Holder == "" || strings.IndexFunc(p.Holder, unicode.IsControl) >= 0:
		return fmt.Sprintf("holder %q is not a job id", clip(p.Holder))
	case p.Host == "":
		return "no host"
	case p.PID <= 0:
		return fmt.Sprintf("pid %d", p.PID)
	case p.Created.IsZero():
		return "no creation time"
	}
	return ""
}

// staleness says why pin p is stale as seen from host h, or "" when it is live.
func staleness(p pinRecord, h host) string {
	if p.Host != h.name || p.PID <= 0 {
		return ""
	}
	if p.BootID != "" && h.bootID != "" && p.BootID != h.bootID {
		return "the host rebooted since"
	}
	if err := syscall.Kill(p.PID, 0); errors.Is(err, syscall.ESRCH) {
		return fmt.Sprintf("process %d is gone", p.PID)
	}
	if p.PIDStartTicks != 0 {
		if now, ok := processStartTicks(p.PID); ok && now != p.PIDStartTicks {
			return fmt.Sprintf("pid %d now belongs to another process", p.PID)
		}
	}
	return ""
}

// processStartTicks returns field 22 (starttime) of /proc/PID/stat.
func processStartTicks(pid int) (uint64, bool) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// Field 2 (comm) is parenthesised and may hold spaces: split after its last ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(string(data[i+1:]))
	// fields[0] is field 3 (state), so field 22 is fields[19].
	if len(fields) < 20 {
		return 0, false
	}
	n, err := strconv.ParseUint(fields[19], 10, 64)
	return n, err == nil
}

// Pin records that holder (a job id) resumed from the checkpoint at path, inside
// checkpoint directory dir, so that Prune never deletes it. The pin is a file under
// DIR/.gangrun/pins/ carrying holder, this host's name and boot id, and this process's
// pid and start time; it lasts until release is called or this process dies (see the
// staleness rule at the top of pin.go). release is idempotent.
//
// Errors: holder empty or holding control characters; path not directly inside dir;
// path missing (a *DirError); the pin directory not writable; a concurrent Plan.Apply
// holding the lock for longer than pinLockTimeout.
func Pin(dir, path, holder string) (release func() error, err error) {
	if holder == "" || strings.IndexFunc(holder, unicode.IsControl) >= 0 {
		return nil, fmt.Errorf("pin %s: holder %q must be a non-empty job id without control characters", path, holder)
	}
	name, err := childName(dir, path)
	if err != nil {
		return nil, err
	}
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	st, err := openState(dir, true)
	if err != nil {
		return nil, fmt.Errorf("pin %s: %w", path, err)
	}
	defer st.close()
	pins, err := st.sub(pinsDirName, true)
	if err != nil {
		return nil, fmt.Errorf("pin %s: %w", path, err)
	}
	defer pins.Close()
	ctx, cancel := context.WithTimeout(context.Background(), pinLockTimeout)
	defer cancel()
	unlock, err := lockDir(ctx, st)
	if err != nil {
		return nil, fmt.Errorf("pin %s: %w", path, err)
	}
	defer unlock()
	// Checked under the lock: Plan.Apply moves a checkpoint aside under the same lock,
	// so a checkpoint seen here is not being deleted.
	if _, err := st.root.Lstat(name); err != nil {
		de := dirError(path, err)
		de.what = "checkpoint"
		return nil, de
	}
	h := localHost()
	rec := pinRecord{Checkpoint: name, Holder: holder, Host: h.name, PID: os.Getpid(), BootID: h.bootID, Created: time.Now().UTC()}
	rec.PIDStartTicks, _ = processStartTicks(rec.PID)
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("pin %s: encode: %w", path, err)
	}
	file := pinPrefix + randomHex(8) + pinSuffix
	if err := pins.WriteFileAtomic(file, data, 0o644); err != nil {
		return nil, fmt.Errorf("pin %s: %w", path, err)
	}
	var once sync.Once
	var relErr error
	return func() error {
		once.Do(func() { relErr = removePin(dir, file) })
		return relErr
	}, nil
}

// removePin removes the pin file name from dir's pins, through a stateDir.
func removePin(dir, name string) error {
	st, err := openState(dir, false)
	if isMissing(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("release pin %s: %w", name, err)
	}
	defer st.close()
	pins, err := st.sub(pinsDirName, false)
	if isMissing(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("release pin %s: %w", name, err)
	}
	defer pins.Close()
	if err := pins.Remove(name); err != nil {
		return fmt.Errorf("release pin: %w", err)
	}
	return nil
}

// childName returns path's name when path is directly inside dir.
func childName(dir, path string) (string, error) {
	absDir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("checkpoint dir %q: %w", dir, err)
	}
	absPath, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("checkpoint %q: %w", path, err)
	}
	if filepath.Dir(absPath) != absDir || filepath.Base(absPath) == "." || strings.HasPrefix(filepath.Base(absPath), ".") {
		return "", fmt.Errorf("checkpoint %q is not directly inside checkpoint dir %q", path, dir)
	}
	return filepath.Base(absPath), nil
}

// randomHex returns n random bytes as hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
