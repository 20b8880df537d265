"""One adapter script per job queue library; run by benchmarks/run.py."""
