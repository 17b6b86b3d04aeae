"""The pure core of the spawner: hardware facts (catalog), placement, the waiting queue, the
spawn form, server records, disk rules. No hub, no I/O beyond reading the shipped catalog."""
