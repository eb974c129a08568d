package checkpoint

import "io/fs"

// FormatLightning is PyTorch Lightning's *.ckpt files, written by torch.save
// (lightning/pytorch/callbacks/model_checkpoint.py): complete by the *.ckpt rule
// (ckptfile.go, checkCkpt).
const FormatLightning Format = "lightning"

// lightningLayout is PyTorch Lightning's ModelCheckpoint layout: NAME.ckpt files
// (epoch=E-step=N.ckpt by default, last.ckpt rewritten at every save or, with
// save_last="link", a symlink to the newest) and, with the DeepSpeed and FSDP
// strategies, NAME.ckpt directories. Under auto-detection it owns every *.ckpt entry
// NeMo does not claim first, and a Verify path that is not a directory.
type lightningLayout struct{}

func (lightningLayout) info() layoutInfo {
	return layoutInfo{format: FormatLightning, names: "*.ckpt"}
}

func (lightningLayout) candidate(dir, name string, typ fs.FileMode) *candidate {
	return ckptCandidate(dir, name, typ)
}

func (lightningLayout) reserves(string) bool { return false }

func (lightningLayout) judge(s *scan, c *candidate) verdict {
	return s.judgeCkpt(c, FormatLightning)
}

func (lightningLayout) claim(s *scan, c *candidate) nameClaim {
	if s.isCkptEntry(c) {
		return mineAlone
	}
	return notMine
}

func (lightningLayout) detect(*scan, *candidate, string, []fs.DirEntry) (verdict, bool) {
	return verdict{}, false
}

func (lightningLayout) notes(*scan) []string { return nil }
