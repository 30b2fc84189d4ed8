"""The product database: what the spec keeps outside the actors (dead letters, metrics rows).

Import from the modules (``product.dead_letters``, ``product.database``); the schema of
``<state>/product.sqlite`` is gathered by the composition root
(:mod:`rhumbatron.runtime.product_schema`).
"""
