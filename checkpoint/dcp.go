package checkpoint

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// FormatDCP is torch.distributed.checkpoint (also torchtitan's step-N and Megatron's
// torch_dist): complete when a non-empty `.metadata` exists, because
// FileSystemWriter.finish renames `.metadata.tmp` to `.metadata` after every data file
// is written (torch/distributed/checkpoint/filesystem.py).
const FormatDCP Format = "dcp"

// dcpMetadata is torch.distributed.checkpoint's metadata file. FileSystemWriter
// writes and fsyncs `.metadata.tmp` after every data file, then renames it to
// `.metadata` (torch/distributed/checkpoint/filesystem.py, FileSystemWriter.finish;
// torch 1.13: torch/distributed/_shard/checkpoint/filesystem.py).
const dcpMetadata = ".metadata"

// dcpLayout is torch.distributed.checkpoint's directory layout under the generic
// layout's names (torchtitan writes step-N). It owns no name: under auto-detection a
// `.metadata` file inside a directory decides, after `.complete` and
// trainer_state.json.
type dcpLayout struct{}

func (dcpLayout) info() layoutInfo { return layoutInfo{format: FormatDCP, marker: dcpMetadata} }

func (dcpLayout) candidate(_, name string, typ fs.FileMode) *candidate {
	return stepDirCandidate(name, typ, famStep, famCheckpoint, famGlobalStep, famIter)
}

func (dcpLayout) reserves(string) bool { return false }

func (dcpLayout) judge(s *scan, c *candidate) verdict { return checkDCP(s.path(c), FormatDCP) }

func (dcpLayout) claim(*scan, *candidate) nameClaim { return notMine }

// detect: a `.metadata` file. A layout whose trainer writes DCP directories under its
// own names and rules judges c when it says c is its own (Megatron-LM's torch_dist
// iterations, which also need metadata.json; Composer's sharded ep-ba directories);
// otherwise torch.distributed.checkpoint's rule, reported as dcp.
func (dcpLayout) detect(s *scan, c *candidate, dir string, entries []fs.DirEntry) (verdict, bool) {
	if !hasEntry(entries, dcpMetadata) {
		return verdict{}, false
	}
	for _, l := range s.layouts {
		if w, ok := l.(dcpWriter); ok {
			if v, mine := w.judgeDCP(s, c, dir, entries); mine {
				return v, true
			}
		}
	}
	return checkDCP(dir, FormatDCP), true
}

func (dcpLayout) notes(*scan) []string { return nil }

// dcpWriter is a layout whose trainer may save its own checkpoints as
// torch.distributed.checkpoint directories (Megatron-LM's torch_dist, torch_dcp and
// fsdp_dtensor formats; Composer's sharded checkpoints).
type dcpWriter interface {
	// judgeDCP judges directory candidate c, whose listing (entries, of dir) holds
	// `.metadata`, by the layout's own rule and reports it under the layout's format;
	// mine is false when c is not this layout's checkpoint.
	judgeDCP(s *scan, c *candidate, dir string, entries []fs.DirEntry) (v verdict, mine bool)
}

// checkDCP applies torch.distributed.checkpoint's rule: a non-empty regular
// `.metadata` file. label is the format reported (dcp, or megatron for torch_dist).
func checkDCP(dir string, label Format) verdict {
	if _, err := os.Stat(dir); err != nil {
		return notDone(label, "%s", describeFSError(err))
	}
	fi, err := os.Stat(filepath.Join(dir, dcpMetadata))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return notDone(label, "no %s: torch.distributed.checkpoint renames it into place after every shard, so the save did not finish", dcpMetadata)
	case err != nil:
		return notDone(label, "%s: %s", dcpMetadata, describeFSError(err))
	case !fi.Mode().IsRegular():
		return notDone(label, "%s is not a regular file", dcpMetadata)
	case fi.Size() == 0:
		return notDone(label, "%s is empty (0 bytes)", dcpMetadata)
	}
	return done(label)
}
