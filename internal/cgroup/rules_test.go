package cgroup

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gangrun/gangrun/topology"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestGPUDeviceRulesGolden checks, for the recorded inventories, the devices rules of a
// step given every allocatable device, the first two, and the last one, against
// testdata/devices/<inventory>.golden (go test -run TestGPUDeviceRulesGolden -update).
func TestGPUDeviceRulesGolden(t *testing.T) {
	for _, name := range []string{"dgx-h100", "dgx-a100", "dgx-a100-mig", "pcie-2socket", "dgx1", "cpu-only"} {
		t.Run(name, func(t *testing.T) {
			inv, err := topology.LoadFile(filepath.Join("..", "..", "topology", "testdata", "inventories", name+".json"))
			if err != nil {
				t.Fatal(err)
			}
			all := inv.Allocatable()
			var b bytes.Buffer
			fmt.Fprintf(&b, "# %s: %d GPUs, %d allocatable devices\n", name, len(inv.GPUs), len(all))
			cases := []struct {
				what    string
				devices []topology.Device
			}{{"every allocatable device", all}}
			if len(all) > 2 {
				cases = append(cases, struct {
					what    string
					devices []topology.Device
				}{"the first two", all[:2]})
			}
			if len(all) > 0 {
				cases = append(cases, struct {
					what    string
					devices []topology.Device
				}{"the last one", all[len(all)-1:]})
			}
			for _, c := range cases {
				ids := make([]string, len(c.devices))
				for i, d := range c.devices {
					ids[i] = d.ID
				}
				fmt.Fprintf(&b, "[%s: %s]\n", c.what, strings.Join(ids, ","))
				for _, r := range GPUDeviceRules(inv, c.devices) {
					fmt.Fprintf(&b, "%s  # %s\n", r, r.Path)
				}
			}
			golden := filepath.Join("testdata", "devices", name+".golden")
			if *update {
				if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if got := b.String(); got != string(want) {
				t.Errorf("rules differ from %s (rerun with -update and review the diff):\n%s", golden, got)
			}
		})
	}
}

// TestParseMem: Slurm's --mem forms, megabytes by default, and the refusals.
func TestParseMem(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		err  string
	}{
		{"4G", 4 << 30, ""}, {"4g", 4 << 30, ""}, {"500M", 500 << 20, ""}, {"1024", 1024 << 20, ""},
		{"16384K", 16 << 20, ""}, {"64K", 0, "at least 16M"}, {"1K", 0, "at least 16M"}, {"15", 0, "at least 16M"}, {"2T", 2 << 40, ""}, {"0", 0, ""}, {"1024P", 0, "want a size"},
		{"", 0, "want a size"}, {"G", 0, "want a size"}, {"-1G", 0, "want a size"}, {"1.5G", 0, "want a size"},
		{"4GB", 4 << 30, ""}, {"512mb", 512 << 20, ""}, {"4Gx", 0, "want a size"}, {"1024B", 0, "want a size"}, {"GB", 0, "want a size"}, {"2000T", 0, "at most 1P"}, {"99999999999999999999", 0, "at most 1P"},
	} {
		got, err := ParseMem(c.in)
		switch {
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("ParseMem(%q) = %d, %v; want %d", c.in, got, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), fmt.Sprintf("%q", c.in))):
			t.Errorf("ParseMem(%q) = %d, %v; want an error naming it with %q", c.in, got, err, c.err)
		}
	}
	for _, c := range []struct {
		in   int64
		want string
	}{{4 << 30, "4G"}, {1536 << 20, "1536M"}, {0, "0"}, {1000, "1000"}, {3 << 40, "3T"}} {
		if got := FormatMem(c.in); got != c.want {
			t.Errorf("FormatMem(%d) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestParseMode: --cgroup's values; "" is auto; anything else is refused naming it.
func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"": Auto, "auto": Auto, "off": Off, "required": Required} {
		if got, err := ParseMode(in); err != nil || got != want {
			t.Errorf("ParseMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseMode("on"); err == nil || !strings.Contains(err.Error(), `--cgroup "on"`) {
		t.Errorf("ParseMode(on) = %v; want an error naming it", err)
	}
}
