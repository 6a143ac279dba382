"""Major-version upgrades: the version gate, the state machine and its step."""
