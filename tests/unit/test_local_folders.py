"""`make demo` never wipes what `make up` keeps (issue #20): the demo wipes the state and NATS
store of its own folder, and that folder holds none of `rhumbatron up`'s."""

from __future__ import annotations

from rhumbatron_dev import demo
from rhumbatron_dev.local import up


def test_the_demo_wipes_a_folder_of_its_own_not_the_one_up_keeps() -> None:
    wiped = {demo.DEFAULT_ROOT / "state", demo.DEFAULT_ROOT / "nats"}
    kept = {up.DEFAULT_ROOT / "state", up.DEFAULT_ROOT / "nats"}
    for folder in wiped:
        assert all(folder != k and k not in folder.parents for k in kept), folder
        assert all(folder not in k.parents for k in kept), folder
