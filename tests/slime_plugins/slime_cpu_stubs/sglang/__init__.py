"""Stand-in for SGLang: ``sglang.srt.server_args`` is real enough for Slime's parser, the rest raises on use."""

import importlib.abc
import importlib.machinery
import sys
import types


class _Unavailable:
    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is not available: SGLang is stubbed on this CPU machine")

    def __getattr__(self, attr: str):
        return _Unavailable(f"{self._name}.{attr}")


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any ``sglang.*`` module without a file here becomes an empty stub module (a package, so nesting works)."""

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith("sglang.") or importlib.machinery.PathFinder.find_spec(fullname, path):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.append(_Finder())
