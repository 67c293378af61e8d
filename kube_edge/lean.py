"""The parts of the official `kubernetes` client tessera uses, without the rest.

`import kubernetes` (or any of its submodules) runs the package's `__init__`, which imports
every API class and the generated models package: with kubernetes 37 (pydantic models) that
is about 20 MB of resident memory, a third of the node agent's budget, for programs that
need `Configuration` and one config loader.

`load()` installs the packages `kubernetes`, `kubernetes.client`, `kubernetes.client.models`,
`kubernetes.config` and `kubernetes.utils` as lazy stand-ins: empty modules with the real
package path, so that importing a submodule (`kubernetes.client.api_client`) loads only that
module and what it imports. Nothing is lost: the first access to a name a stand-in lacks
(`kubernetes.client.CoreV1Api`, `kubernetes.watch`, a model class) runs the real `__init__`
into the stand-in and returns the name, so other code in the process sees the whole package.
When the package is already imported, it is used as it is.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

_LAZY_PACKAGES = (
    "kubernetes",
    "kubernetes.client",
    "kubernetes.client.models",
    "kubernetes.config",
    "kubernetes.utils",
)
_lock = threading.RLock()
_STAND_IN_GETATTR: dict[str, Callable[[str], Any]] = {}


@dataclass(frozen=True)
class KubernetesClient:
    """The few entry points the agent uses."""

    Configuration: Any
    RESTClientObject: Any
    load_kube_config: Any
    load_incluster_config: Any


def _complete(module: ModuleType, init: Path, name: str) -> Any:
    """Run the real package `__init__` into the stand-in, once, then look `name` up."""
    with _lock:
        if not module.__dict__.get("__lean_completed__"):
            module.__dict__["__lean_completed__"] = True
            ours = module.__dict__.get("__getattr__")
            spec = importlib.util.spec_from_file_location(
                module.__name__, init, submodule_search_locations=[str(init.parent)]
            )
            assert spec is not None and spec.loader is not None
            spec.loader.exec_module(module)
            if module.__dict__.get("__getattr__") is ours:
                del module.__dict__["__getattr__"]  # the real package has none of its own
    if name in module.__dict__:
        return module.__dict__[name]
    own = module.__dict__.get("__getattr__")
    if own is not None and own is _STAND_IN_GETATTR.get(module.__name__):
        # the real __init__ is still running (it asked for a submodule it is importing)
        raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")
    if own is not None:  # a package that is lazy itself (kubernetes.client.models)
        return own(name)
    # a submodule the package's __init__ does not import: import it the ordinary way
    try:
        return importlib.import_module(f"{module.__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}") from None


def _stand_in(name: str, directory: Path) -> ModuleType:
    module = ModuleType(name)
    spec = importlib.util.spec_from_file_location(
        name, directory / "__init__.py", submodule_search_locations=[str(directory)]
    )
    module.__spec__ = spec
    module.__path__ = [str(directory)]
    module.__file__ = str(directory / "__init__.py")
    module.__package__ = name
    init = directory / "__init__.py"

    def complete_on_access(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _complete(module, init, attr)

    module.__dict__["__getattr__"] = complete_on_access  # PEP 562
    _STAND_IN_GETATTR[name] = complete_on_access
    return module


def _install() -> None:
    spec = importlib.util.find_spec("kubernetes")  # finds, does not run, the package
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the kubernetes package is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    for name in _LAZY_PACKAGES:
        directory = root.joinpath(*name.split(".")[1:])
        module = _stand_in(name, directory)
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)


def load() -> KubernetesClient:
    """Configuration, ApiClient and the config loaders, importing as little as possible."""
    with _lock:
        if "kubernetes" not in sys.modules:
            _install()
        configuration = importlib.import_module("kubernetes.client.configuration")
        rest = importlib.import_module("kubernetes.client.rest")
    return KubernetesClient(
        Configuration=configuration.Configuration,
        RESTClientObject=rest.RESTClientObject,
        load_kube_config=_loader("kube_config", "load_kube_config"),
        load_incluster_config=_loader("incluster_config", "load_incluster_config"),
    )


def _loader(module: str, function: str) -> Any:
    """A config loader imported on first call: in-cluster never loads the kubeconfig one
    (and its OAuth and requests dependencies)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(config_module(module), function)(*args, **kwargs)

    return call


def _api_client(*args: Any, **kwargs: Any) -> Any:
    """What the kubeconfig loader gets as ApiClient: the real one, imported when called (it
    is only called by `new_client_from_config`, which the agent does not use)."""
    return importlib.import_module("kubernetes.client.api_client").ApiClient(*args, **kwargs)


def config_module(module: str) -> ModuleType:
    """`kubernetes.config.<module>`, imported without the rest of the package."""
    name = f"kubernetes.config.{module}"
    with _lock:
        if name in sys.modules:
            return sys.modules[name]
        if "kubernetes" not in sys.modules:
            _install()
        # kubernetes.config's modules import Configuration and ApiClient by name from the
        # client package: the real Configuration stays; the deferred ApiClient is offered
        # only during this import, so everyone else still gets the real class
        client = sys.modules["kubernetes.client"]
        names = client.__dict__
        if "Configuration" not in names:
            configuration = importlib.import_module("kubernetes.client.configuration")
            names["Configuration"] = configuration.Configuration
        lend = "ApiClient" not in names
        if lend:
            names["ApiClient"] = _api_client
        try:
            return importlib.import_module(name)
        finally:
            if lend:
                del names["ApiClient"]
