"""Failover drills in the lab: fail the primary under a client load and
judge what the clients saw (failover.py; commit_protection.py for the
commit-protection lemmas)."""
