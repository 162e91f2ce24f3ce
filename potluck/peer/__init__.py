"""The daemon a volunteer runs: join, probe, announce, train."""
