"""What the commands print: a job's progress (``job``), the swarm's jobs and leases (``jobs``), the live
monitor's frame (``monitor``). Rendering only: the numbers come from ``potluck.telemetry``."""
