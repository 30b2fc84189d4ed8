"""Rhumbatron's development package: what runs on a developer's machine, never in a Lambda.

* :mod:`rhumbatron_dev.local`: the embedded default (nats-server and moto's S3 on loopback),
  the local loop that plays every role in rounds, ``rhumbatron up`` and ``rhumbatron invoke``;
* :mod:`rhumbatron_dev.dashboard`: ``rhumbatron up``'s local dashboard;
* :mod:`rhumbatron_dev.demo`: ``make demo``; :mod:`rhumbatron_dev.scenario`: the
  recorded-scenario runner;
* :mod:`rhumbatron_dev.testing`: the sender test doubles every suite shares.

It imports :mod:`rhumbatron`; :mod:`rhumbatron` never imports it at module level (the CLI's
``demo``, ``up`` and ``invoke`` import it when they run). The Lambda code layer is built from
``shared/rhumbatron`` alone (``layers/Makefile``), so none of this ships to AWS. It needs the
``local`` extra: ``pip install -e '.[local]'`` (``.[dev]`` includes it) installs both packages.
"""
