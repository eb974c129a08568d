package allocator

import (
	"context"
	"errors"
	"fmt"

	"github.com/gangrun/gangrun/internal/store"
	"github.com/gangrun/gangrun/topology"
)

// errNoInventory means a node's record exists but its inventory key does not (an agent
// that registered half-way, or a record written by hand).
var errNoInventory = errors.New("no inventory stored")

// inventories are the nodes' topology inventories (gangrun/inventory/<node>) as the
// device ranker reads them: fetched from the store once, and again only when the
// node's record names another hash (NodeRecord.InventoryHash). Not safe for
// concurrent use: the scheduler's loop owns it.
type inventories struct {
	s      store.Store
	byNode map[string]cachedInventory
}

type cachedInventory struct {
	hash string
	inv  *topology.Inventory
}

func newInventories(s store.Store) *inventories {
	return &inventories{s: s, byNode: map[string]cachedInventory{}}
}

// get returns node n's inventory. Errors: the store's; errNoInventory; a stored
// inventory that does not decode.
func (c *inventories) get(ctx context.Context, n *NodeState) (*topology.Inventory, error) {
	name := n.Record.Name
	ci, ok := c.byNode[name]
	if ok && ci.hash == n.Record.InventoryHash {
		return ci.inv, nil
	}
	e, err := c.s.Get(ctx, inventoryPrefix+name)
	if err != nil {
		return nil, err
	}
	if e == nil {
		return nil, errNoInventory
	}
	inv, err := topology.Decode(e.Value)
	if err != nil {
		return nil, fmt.Errorf("stored inventory: %w", err)
	}
	c.byNode[name] = cachedInventory{hash: n.Record.InventoryHash, inv: inv}
	return inv, nil
}
