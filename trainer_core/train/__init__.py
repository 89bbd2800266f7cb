"""Training on the KV store or the workers' collectives: learners (CNTK's names), the
communicators, data, networks and checkpoints."""
