"""The telemetry plane: MQTT publishers and subscribers, the embedded broker, the swarm's aggregate view,
Prometheus metrics and the web dashboard. Schemas and topics live in ``potluck.protocol.telemetry``."""
