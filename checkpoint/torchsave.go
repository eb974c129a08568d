package checkpoint

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The file formats the trainers' files are written in, checked without loading them:
// torch.save's zip archive (DeepSpeed's and Megatron-LM's rank files, accelerate's
// states, Composer's and OLMo-core's files) and safetensors (accelerate's and
// torchtitan's weights). Each trainer writes these files in place (open, write, close),
// so a save cut short leaves a prefix of the file: the checks below look for what only
// the end of a whole file holds.

// Zip end records (APPNOTE.TXT 4.3.16, 4.3.14, 4.3.15): torch.save's
// PyTorchStreamWriter writes every record, then the central directory, then the zip64
// end of central directory record and its locator (always, whatever the size), then the
// end of central directory record as the file's last bytes.
const (
	zipEOCDSig       = 0x06054b50
	zipEOCDLen       = 22
	zip64LocatorSig  = 0x07064b50
	zip64LocatorLen  = 20
	zip64EOCDSig     = 0x06064b50
	zip64EOCDMinLen  = 56
	zipMaxCommentLen = 0xffff
)

// checkTorchSaveFile checks that entry name of dir is a whole file in torch.save's zip
// format: a non-empty regular file (following a symlink) that ends with a zip end of
// central directory record whose central directory ends where the record begins. It
// reads at most the last 64 KiB of the file (and the zip64 end record), never the
// central directory itself, so checking thousands of rank files stays cheap; it does
// not verify CRCs or that the archive holds data.pkl (checkTorchZip does, for a single
// Lightning file). The verdict on failure is labelled f.
func checkTorchSaveFile(dir, name string, f Format) (verdict, bool) {
	path := filepath.Join(dir, name)
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) && !entryExists(path):
		return notDone(f, "%s missing", name), false
	case err != nil:
		return notDone(f, "%s: %s", name, describeFSError(err)), false
	case !fi.Mode().IsRegular():
		return notDone(f, "%s is not a regular file", name), false
	case fi.Size() == 0:
		return notDone(f, "%s is empty (0 bytes)", name), false
	}
	if why := torchZipTail(path, fi.Size()); why != "" {
		return notDone(f, "%s %s: torch.save writes it in place, so its save was cut short", name, why), false
	}
	return verdict{}, true
}

// torchZipTail returns "" when the file at path (size bytes) ends with a consistent zip
// end of central directory record, or what is wrong.
func torchZipTail(path string, size int64) string {
	file, err := os.Open(path)
	if err != nil {
		return "cannot be opened (" + describeFSError(err) + ")"
	}
	defer file.Close()
	n := int64(zipEOCDLen + zipMaxCommentLen)
	if n > size {
		n = size
	}
	tail := make([]byte, n)
	if _, err := file.ReadAt(tail, size-n); err != nil && !errors.Is(err, io.EOF) {
		return "cannot be read (" + describeFSError(err) + ")"
	}
	at := lastEOCD(tail)
	if at < 0 {
		return "has no zip end record"
	}
	eocdOff := size - n + int64(at)
	rec := tail[at:]
	cdSize := int64(binary.LittleEndian.Uint32(rec[12:16]))
	cdOff := int64(binary.LittleEndian.Uint32(rec[16:20]))
	cdEnd := eocdOff
	locAt := at - zip64LocatorLen
	hasLocator := locAt >= 0 && binary.LittleEndian.Uint32(tail[locAt:]) == zip64LocatorSig
	if cdSize == 0xffffffff || cdOff == 0xffffffff || hasLocator {
		// zip64 (torch.save always writes it): the locator sits right before the end
		// record and names the zip64 end record, which follows the central directory and
		// whose fields are the real ones.
		if !hasLocator {
			return "has a zip64 end record without its locator"
		}
		z64Off := int64(binary.LittleEndian.Uint64(tail[locAt+8 : locAt+16]))
		if z64Off < 0 || z64Off+zip64EOCDMinLen > eocdOff-zip64LocatorLen {
			return "names a zip64 end record outside the file"
		}
		z64 := make([]byte, zip64EOCDMinLen)
		if _, err := file.ReadAt(z64, z64Off); err != nil || binary.LittleEndian.Uint32(z64) != zip64EOCDSig {
			return "has no zip64 end record where its locator says"
		}
		cdSize = int64(binary.LittleEndian.Uint64(z64[40:48]))
		cdOff = int64(binary.LittleEndian.Uint64(z64[48:56]))
		cdEnd = z64Off
	}
	if cdOff < 0 || cdSize < 0 || cdOff > cdEnd || cdOff+cdSize != cdEnd {
		return "has a zip end record inconsistent with its length"
	}
	return ""
}

// lastEOCD returns the offset in tail of the last end of central directory record whose
// comment reaches exactly the end of tail, or -1.
func lastEOCD(tail []byte) int {
	for i := len(tail) - zipEOCDLen; i >= 0; i-- {
		if binary.LittleEndian.Uint32(tail[i:]) != zipEOCDSig {
			continue
		}
		if i+zipEOCDLen+int(binary.LittleEndian.Uint16(tail[i+20:])) == len(tail) {
			return i
		}
	}
	return -1
}

// maxSafetensorsHeader bounds the JSON header of a safetensors file that is read, in
// bytes (100 MB, the limit the safetensors library itself enforces: MAX_HEADER_SIZE).
const maxSafetensorsHeader = 100_000_000

// checkSafetensorsFile checks that entry name of dir is a whole safetensors file: an
// 8-byte little-endian header length N, a JSON object of N bytes, and exactly as many
// data bytes as the largest end of the tensors' data_offsets (the safetensors format,
// huggingface/safetensors README "Format"). safetensors' save_file writes it in place,
// so a save cut short leaves fewer data bytes than the header promises. The verdict on
// failure is labelled f.
func checkSafetensorsFile(dir, name string, f Format) (verdict, bool) {
	path := filepath.Join(dir, name)
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) && !entryExists(path):
		return notDone(f, "%s missing", name), false
	case err != nil:
		return notDone(f, "%s: %s", name, describeFSError(err)), false
	case !fi.Mode().IsRegular():
		return notDone(f, "%s is not a regular file", name), false
	}
	if why := safetensorsProblem(path, fi.Size()); why != "" {
		return notDone(f, "%s %s", name, why), false
	}
	return verdict{}, true
}

// safetensorsProblem returns "" when the file at path (size bytes) is a whole
// safetensors file, or what is wrong.
func safetensorsProblem(path string, size int64) string {
	if size < 8 {
		return fmt.Sprintf("is %d bytes, shorter than a safetensors header: its save was cut short", size)
	}
	file, err := os.Open(path)
	if err != nil {
		return "cannot be opened (" + describeFSError(err) + ")"
	}
	defer file.Close()
	var lenBuf [8]byte
	if _, err := io.ReadFull(file, lenBuf[:]); err != nil {
		return "cannot be read (" + describeFSError(err) + ")"
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > maxSafetensorsHeader || int64(n) > size-8 {
		return fmt.Sprintf("names a %d-byte header in a %d-byte file: its save was cut short", n, size)
	}
	header := make([]byte, n)
	if _, err := io.ReadFull(file, header); err != nil {
		return "cannot be read (" + describeFSError(err) + ")"
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(bytes.TrimRight(header, " "), &entries); err != nil {
		return "has a header that is not a JSON object: not a safetensors file"
	}
	var end uint64
	for key, raw := range entries {
		if key == "__metadata__" {
			continue
		}
		var t struct {
			DataOffsets []uint64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw, &t); err != nil || len(t.DataOffsets) != 2 || t.DataOffsets[0] > t.DataOffsets[1] {
			return fmt.Sprintf("has a bad header entry for %q: not a safetensors file", clip(key))
		}
		end = max(end, t.DataOffsets[1])
	}
	if have := uint64(size) - 8 - n; have != end {
		return fmt.Sprintf("holds %d data bytes, its header says %d: its save was cut short", have, end)
	}
	return ""
}

// entryExists reports whether path names a directory entry, a broken symlink included.
func entryExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// readTorchSaveDict reads the pickle of a torch.save file (its ARCHIVE/data.pkl entry)
// and returns it when it is a dict, without loading any tensor: the values a trainer
// records beside its tensors (pickle.go keeps ints, strings, lists, dicts).
func readTorchSaveDict(path string) (*pyDict, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	zr, err := zip.NewReader(f, fi.Size())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, zf := range zr.File {
		if zf.Name != "data.pkl" && !strings.HasSuffix(zf.Name, "/data.pkl") {
			continue
		}
		if zf.UncompressedSize64 > maxPickleBytes {
			return nil, fmt.Errorf("%s: data.pkl is %d bytes: %w", path, zf.UncompressedSize64, errPickle)
		}
		r, err := zf.Open()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		data, err := io.ReadAll(io.LimitReader(r, maxPickleBytes+1))
		r.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		v, err := readPickle(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		d, ok := v.(*pyDict)
		if !ok {
			return nil, fmt.Errorf("%s: data.pkl holds %T, not a dict: %w", path, v, errPickle)
		}
		return d, nil
	}
	return nil, fmt.Errorf("%s: no data.pkl: %w", path, errPickle)
}

// pyInt returns d[key] when it is an int.
func (d *pyDict) pyInt(key string) (int64, bool) {
	v, ok := d.m[key].(int64)
	return v, ok
}
