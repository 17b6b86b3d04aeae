"""The server lifecycle both backends share: options, placement in the hub (and its queue),
billing's side of a server (admission, metering), changing a running server's GPU."""
