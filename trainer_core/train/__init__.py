"""Training on the KV API: learners (CNTK's names), the communicator, data, networks and checkpoints."""
