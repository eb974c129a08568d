package hostlist

import (
	"fmt"
	"testing"
)

// benchHosts returns 10,000 host names as a Slurm allocation might have them:
// 40 racks of 256 nodes with every 40th node missing, so that the compressed
// form has many ranges rather than one.
func benchHosts() []string {
	var hosts []string
	for rack := 1; len(hosts) < 10000; rack++ {
		for node := 1; node <= 256 && len(hosts) < 10000; node++ {
			if node%40 != 0 {
				hosts = append(hosts, fmt.Sprintf("r%02dn%03d", rack, node))
			}
		}
	}
	return hosts
}

func BenchmarkExpand(b *testing.B) {
	cases := []struct{ name, expr string }{
		{"10k_one_range", "node[00001-10000]"},
		{"10k_fragmented", Compress(benchHosts())},
		{"10k_product", "rack[01-10]-node[0001-1000]"},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				hosts, err := Expand(tc.expr)
				if err != nil || len(hosts) != 10000 {
					b.Fatalf("Expand = %d hosts, %v", len(hosts), err)
				}
			}
		})
	}
}

func BenchmarkCompress10k(b *testing.B) {
	hosts := benchHosts()
	for b.Loop() {
		if Compress(hosts) == "" {
			b.Fatal("empty")
		}
	}
}

func BenchmarkCount10k(b *testing.B) {
	expr := Compress(benchHosts())
	for b.Loop() {
		if n, err := Count(expr); err != nil || n != 10000 {
			b.Fatalf("Count = %d, %v", n, err)
		}
	}
}
