package topology

import (
	"errors"
	"testing"

	"github.com/gangrun/gangrun/internal/schema"
)

// TestInventoryVersion: the inventory's "schema_version" is the one `gangrun version`
// lists for it, and a newer one is refused as every newer record is.
func TestInventoryVersion(t *testing.T) {
	if schema.Inventory.Version() != SchemaVersion {
		t.Fatalf("schema.Inventory.Version() = %d, topology.SchemaVersion = %d: keep them equal", schema.Inventory.Version(), SchemaVersion)
	}
	_, err := Decode([]byte(`{"schema_version": 2, "node": "a"}`))
	var ne *schema.NewerError
	if !errors.As(err, &ne) || ne.Kind != schema.Inventory || ne.Got != 2 {
		t.Errorf("Decode of a newer inventory: %v, want a schema.NewerError", err)
	}
}
