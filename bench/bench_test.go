package bench

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkParse parses a log of 100 nccl-tests runs (every fixture, repeated).
func BenchmarkParse(b *testing.B) {
	files, _ := filepath.Glob(filepath.Join(fixtures, "*.txt"))
	var log bytes.Buffer
	for range 100 {
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				b.Fatal(err)
			}
			log.Write(data)
		}
	}
	b.SetBytes(int64(log.Len()))
	for b.Loop() {
		if _, err := Parse(bytes.NewReader(log.Bytes()), ParseOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDiagnose64 sweeps and diagnoses 64 simulated nodes (2016 pairs, 63 rounds).
func BenchmarkDiagnose64(b *testing.B) {
	names := make([]string, 64)
	for i := range names {
		names[i] = "node" + string(rune('A'+i/26)) + string(rune('a'+i%26))
	}
	s := newSim(names...)
	s.nodeGBps[names[7]] = 10
	f, err := Sweep(context.Background(), s.nodes, s.run, nil)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		d, err := Diagnose(f, DefaultSlowThreshold)
		if err != nil || len(d.Slow) != 1 {
			b.Fatalf("%v %+v", err, d.Slow)
		}
		if err := WriteFabric(io.Discard, Table, AllReduce, f, d); err != nil {
			b.Fatal(err)
		}
	}
}
