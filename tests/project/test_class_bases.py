"""No runtime class inherits a base from a sibling module: what a class is made of is in its own file, and what
it needs of another file's object it holds (composition), as RelayStore holds its sync pipeline and epoch switch
and DumpSender its start plan. Exceptions (one hierarchy across relay/errors.py and its users) and Protocols (the
seams, relay/reader.py) are the exceptions to the rule; the lab (test harness code) is not runtime."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import relayproxy


def _runtime_modules():
    for info in pkgutil.walk_packages(relayproxy.__path__, "relayproxy."):
        if not info.name.startswith("relayproxy.lab"):
            yield importlib.import_module(info.name)


def borrowed_bases(modules) -> list[str]:
    found = []
    for module in modules:
        for name, cls in vars(module).items():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__:
                continue
            for base in cls.__bases__:
                if not base.__module__.startswith("relayproxy") or base.__module__ == module.__name__:
                    continue
                if issubclass(base, BaseException) or getattr(base, "_is_protocol", False):
                    continue
                found.append(f"{module.__name__}.{name} inherits {base.__module__}.{base.__name__}")
    return found


def test_no_runtime_class_inherits_a_base_from_another_module():
    assert borrowed_bases(_runtime_modules()) == []


def test_the_check_sees_a_mixin_from_another_module():
    import types

    home = types.ModuleType("relayproxy.fake_home")
    mixin = type("Mixin", (), {"__module__": "relayproxy.fake_mixins"})
    home.Store = type("Store", (mixin,), {"__module__": "relayproxy.fake_home"})
    assert borrowed_bases([home]) == ["relayproxy.fake_home.Store inherits relayproxy.fake_mixins.Mixin"]
