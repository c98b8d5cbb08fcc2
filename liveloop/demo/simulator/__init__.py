"""The traffic simulator: synthetic users of a code assistant with hidden, learnable preferences."""
