"""The SQLite run store: one file, group commit, the same contract as every store."""
