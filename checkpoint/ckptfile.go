package checkpoint

import (
	"archive/zip"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// checkCkpt applies Lightning's and NeMo's rule to a *.ckpt candidate (or a NeMo 2
// checkpoint directory). label is the format reported.
//
// A file is complete when it is a readable zip archive holding a data.pkl entry —
// torch.save's format since torch 1.6 (torch/serialization.py, _save with
// _use_new_zipfile_serialization). Lightning writes it in place with one write of an
// in-memory buffer (lightning/fabric/utilities/cloud_io.py, _atomic_save), so a crash
// leaves a prefix without the zip's end records. The check reads the end records and
// the central directory, not every byte: it does not verify CRCs.
//
// A symlink (Lightning's save_last="link" makes last.ckpt one) is judged by its target;
// a broken or self-referencing link is incomplete.
//
// A directory (Lightning's DeepSpeed and FSDP strategies, NeMo's distributed
// checkpoints) is complete when it holds a non-empty `.metadata`
// (torch.distributed.checkpoint), or NeMo 2's weights/.metadata, or a DeepSpeed
// `latest` naming a complete tag inside it.
func checkCkpt(path string, label Format) verdict {
	lfi, err := os.Lstat(path)
	if err != nil {
		return notDone(label, "%s", describeFSError(err))
	}
	fi := lfi
	if lfi.Mode()&fs.ModeSymlink != 0 {
		target, _ := os.Readlink(path)
		fi, err = os.Stat(path)
		switch {
		case err != nil && isLoop(err):
			return notDone(label, "symlink loop (%s -> %s)", filepath.Base(path), target)
		case errors.Is(err, fs.ErrNotExist):
			return notDone(label, "broken symlink to %s", target)
		case err != nil:
			return notDone(label, "symlink to %s: %s", target, describeFSError(err))
		}
	}
	if fi.IsDir() {
		return checkCkptDir(path, label)
	}
	if !fi.Mode().IsRegular() {
		return notDone(label, "not a regular file or directory")
	}
	return checkTorchZip(path, fi.Size(), label)
}

// checkTorchZip checks that path (size bytes) is a zip archive written by torch.save.
func checkTorchZip(path string, size int64, label Format) verdict {
	if size == 0 {
		return notDone(label, "empty file (0 bytes)")
	}
	f, err := os.Open(path)
	if err != nil {
		return notDone(label, "%s", describeFSError(err))
	}
	defer f.Close()
	zr, err := zip.NewReader(f, size)
	if err != nil {
		return notDone(label, "not a readable zip archive (torch.save writes one; truncated?): %v", err)
	}
	for _, zf := range zr.File {
		if zf.Name == "data.pkl" || strings.HasSuffix(zf.Name, "/data.pkl") {
			return done(label)
		}
	}
	return notDone(label, "zip archive without data.pkl: not written by torch.save")
}

// checkCkptDir applies the directory part of checkCkpt.
func checkCkptDir(dir string, label Format) verdict {
	if _, err := os.Lstat(filepath.Join(dir, dcpMetadata)); err == nil {
		v := checkDCP(dir, label)
		v.format = label
		return v
	}
	if _, err := os.Lstat(filepath.Join(dir, "weights", dcpMetadata)); err == nil {
		v := checkDCP(filepath.Join(dir, "weights"), label)
		if !v.complete {
			v.reason = "weights/" + v.reason
		}
		return v
	}
	if data, err := readSmall(filepath.Join(dir, deepSpeedPointer)); err == nil {
		tag := strings.TrimSpace(string(data))
		if !validTag(tag) {
			return notDone(label, "%s/%s holds %q, not a tag name", filepath.Base(dir), deepSpeedPointer, clip(tag))
		}
		v := checkDeepSpeed(filepath.Join(dir, tag))
		v.format = label
		if !v.complete {
			v.reason = tag + ": " + v.reason
		}
		return v
	}
	if _, err := os.ReadDir(dir); err != nil {
		return notDone(label, "%s", describeFSError(err))
	}
	return notDone(label, "checkpoint directory without %s, weights/%s or a DeepSpeed %s: the save did not finish",
		dcpMetadata, dcpMetadata, deepSpeedPointer)
}
