"""One lane's batch: the manager and the lane's transaction."""
