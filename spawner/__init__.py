"""The GPU brain of the hub: catalog, inventory, placement and the spawner backends."""
