"""The test harness: the torture rounds (torture.py), the power-loss layer (powerloss_fs.py) and the cluster
outage round (outage_round.py), each runnable as ``.venv/bin/python tests/harness/<name>.py``."""
