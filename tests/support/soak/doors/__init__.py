"""One driver per door. Each makes calls until told to stop, then waits for their answers,
writing every call, cancel, answer and drop to the run's ledger as it happens."""
