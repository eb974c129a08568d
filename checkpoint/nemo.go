package checkpoint

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// FormatNeMo is NeMo's *.ckpt files and checkpoint directories with their
// `-unfinished` markers (nemo/utils/callbacks/nemo_model_checkpoint.py): complete when
// no marker exists for it and the *.ckpt rule holds (ckptfile.go).
const FormatNeMo Format = "nemo"

// famNeMoDir: a NeMo 2 checkpoint directory, named after its metrics with "step=N"
// and no .ckpt suffix (nemo/lightning/pytorch/callbacks/model_checkpoint.py).
const famNeMoDir family = "nemo-dir"

// nemoUnfinishedSuffix is NeMoModelCheckpoint.UNFINISHED_CHECKPOINT_SUFFIX: NeMo
// writes NAME-unfinished before a save and removes it once every rank has saved.
const nemoUnfinishedSuffix = "-unfinished"

// nemoLayout is NeMo's layout: Lightning's *.ckpt entries (named
// "{name}--{metric}=V-epoch=E-step=N"), NeMo 2 checkpoint directories, and the
// `-unfinished` marker next to a save in progress. Under auto-detection it owns a
// NeMo 2 directory, and a *.ckpt entry when the directory holds a marker or the name
// NeMo's "--"; it judges them from the name alone.
type nemoLayout struct{}

func (nemoLayout) info() layoutInfo { return layoutInfo{format: FormatNeMo} }

func (nemoLayout) candidate(dir, name string, typ fs.FileMode) *candidate {
	if c := ckptCandidate(dir, name, typ); c != nil {
		return c
	}
	if m := stepEqRe.FindStringSubmatch(name); m != nil && (typ.IsDir() || typ&fs.ModeSymlink != 0) {
		c := newCandidate(name, famNeMoDir, typ)
		c.setStep(m[1])
		return c
	}
	return nil
}

// reserves takes every NAME-unfinished entry: a marker, never a checkpoint.
func (nemoLayout) reserves(name string) bool { return isNeMoMarker(name) }

func (nemoLayout) judge(s *scan, c *candidate) verdict {
	return s.judgeCkpt(c, FormatNeMo)
}

func (nemoLayout) claim(s *scan, c *candidate) nameClaim {
	switch {
	case c.fam == famNeMoDir:
		return mineAlone
	case s.isCkptEntry(c) && (s.hasNeMoMarkers() || strings.Contains(c.name, "--")):
		return mineAlone
	}
	return notMine
}

func (nemoLayout) detect(*scan, *candidate, string, []fs.DirEntry) (verdict, bool) {
	return verdict{}, false
}

// notes reports every marker with no checkpoint next to it.
func (nemoLayout) notes(s *scan) []string {
	var out []string
	for name := range s.reserved {
		if isNeMoMarker(name) && !s.markerHasCheckpoint(name) {
			out = append(out, fmt.Sprintf("NeMo marker %s has no checkpoint next to it", name))
		}
	}
	return out
}

// isNeMoMarker reports whether name is a NeMo unfinished-save marker.
func isNeMoMarker(name string) bool { return strings.HasSuffix(name, nemoUnfinishedSuffix) }

// hasNeMoMarkers reports whether the directory holds any NeMo marker.
func (s *scan) hasNeMoMarkers() bool {
	for name := range s.reserved {
		if isNeMoMarker(name) {
			return true
		}
	}
	return false
}

// nemoMarkerName is NeMo's format_checkpoint_unfinished_marker_path applied to a
// candidate name: drop ".nemo", then ".ckpt", then "-EMA", then add "-unfinished".
func nemoMarkerName(name string) string {
	s := strings.TrimSuffix(name, ".nemo")
	s = strings.TrimSuffix(s, ckptExt)
	s = strings.TrimSuffix(s, "-EMA")
	return s + nemoUnfinishedSuffix
}

// markerHasCheckpoint reports whether some candidate's NeMo marker is marker, or a
// file NeMo would have marked with it exists.
func (s *scan) markerHasCheckpoint(marker string) bool {
	for _, c := range s.cands {
		if (c.fam == famCkpt || c.fam == famNeMoDir) && nemoMarkerName(c.name) == marker {
			return true
		}
	}
	stem := strings.TrimSuffix(marker, nemoUnfinishedSuffix)
	for _, name := range []string{stem, stem + ckptExt, stem + "-EMA" + ckptExt, stem + ".nemo"} {
		if _, err := os.Lstat(filepath.Join(s.dir, name)); err == nil {
			return true
		}
	}
	return false
}
