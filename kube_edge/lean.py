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

Other packages get the same treatment. The kubeconfig loader imports `oauthlib` and
`requests_oauthlib` (with `requests`, about 5 MB) for one path only, OIDC token refresh:
`config_module("kube_config")` installs them as stand-ins and lends the loader a deferred
`OAuth2Session`, so they are imported when a refresh happens. And `defer_init(name, ...)`
makes packages that are imported but not used, or used for a submodule only, stand-ins
when they are first imported; a stand-in made this way imports a submodule asked for by
name on its own. kube_edge defers `urllib3.http2` (urllib3 needs its `probe` submodule;
the package `__init__` imports `importlib.metadata`, zipfile, shutil, csv..., about
1.5 MB, for `inject_into_urllib3`); the node agent defers a few more (deviceplugin).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
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
_OAUTH_PACKAGES = ("oauthlib", "oauthlib.oauth2", "requests_oauthlib")
_COMPLETING_DUNDERS = frozenset({"__all__", "__version__"})
"""Names a package's __init__ defines that are asked for by name (`from pkg import *` asks
for __all__). Other dunders are the import system's and tools' probes, answered as missing."""
_lock = threading.RLock()
_STAND_IN_GETATTR: dict[str, Callable[[str], Any]] = {}


@dataclass(frozen=True)
class KubernetesClient:
    """The few entry points the agent uses."""

    Configuration: Any
    RESTClientObject: Any
    should_bypass_proxies: Any
    """(url, no_proxy) -> whether the REST client reaches `url` without its proxy (None in
    releases that read no no_proxy: the proxy is always used)."""
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


def _is_submodule(directory: Path, name: str) -> bool:
    return (directory / f"{name}.py").is_file() or (directory / name / "__init__.py").is_file()


def _stand_in(name: str, directory: Path, *, submodules: bool = False) -> ModuleType:
    """An empty package `name` over `directory` that completes on first access. With
    `submodules`, a name that is a submodule of the package is imported on its own
    (`from pkg import sub` asks the package for `sub` before importing it)."""
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
        if attr.startswith("__") and attr not in _COMPLETING_DUNDERS:
            raise AttributeError(attr)
        completed = module.__dict__.get("__lean_completed__")
        if submodules and not completed and _is_submodule(directory, attr):
            return importlib.import_module(f"{name}.{attr}")
        return _complete(module, init, attr)

    module.__dict__["__getattr__"] = complete_on_access  # PEP 562
    _STAND_IN_GETATTR[name] = complete_on_access
    return module


class _DeferredInit:
    """A meta path finder and loader: the packages it names are imported as stand-ins with
    `submodules` (the import system still binds them to their parent package)."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self.names:
            return None
        real = importlib.machinery.PathFinder.find_spec(fullname, path)
        if real is None or real.origin is None or not real.submodule_search_locations:
            return None
        return importlib.util.spec_from_file_location(
            fullname,
            real.origin,
            loader=self,
            submodule_search_locations=list(real.submodule_search_locations),
        )

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        assert spec.origin is not None
        return _stand_in(spec.name, Path(spec.origin).parent, submodules=True)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the stand-in runs the package `__init__` when a name is used."""

    def load_module(self, fullname: str) -> ModuleType:
        """The legacy loader call, which the import system no longer makes."""
        raise ImportError(f"{fullname} is imported through create_module and exec_module")


def defer_init(*names: str) -> None:
    """Import the packages `names` as stand-ins from now on (see the module doc); a package
    already imported stays as it is."""
    with _lock:
        wanted = frozenset(name for name in names if name not in sys.modules)
        for finder in sys.meta_path:
            if isinstance(finder, _DeferredInit):
                finder.names |= wanted
                return
        sys.meta_path.insert(0, _DeferredInit(wanted))


def _install(names: tuple[str, ...] = _LAZY_PACKAGES) -> None:
    """Stand-ins for `names`, parents before children; a top-level name not installed
    raises ModuleNotFoundError before anything is changed."""
    roots: dict[str, Path] = {}
    for name in names:
        top = name.partition(".")[0]
        if top not in roots:
            spec = importlib.util.find_spec(top)  # finds, does not run, the package
            if spec is None or not spec.submodule_search_locations:
                raise ModuleNotFoundError(f"the {top} package is not installed")
            roots[top] = Path(next(iter(spec.submodule_search_locations)))
    for name in names:
        top, *rest = name.split(".")
        module = _stand_in(name, roots[top].joinpath(*rest))
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
        should_bypass_proxies=getattr(rest, "should_bypass_proxies", None),
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


def _oauth2_session(*args: Any, **kwargs: Any) -> Any:
    """What the kubeconfig loader gets as OAuth2Session: the real one (and `requests`),
    imported when an OIDC token is refreshed."""
    return importlib.import_module("requests_oauthlib").OAuth2Session(*args, **kwargs)


def _lend(module: ModuleType, name: str, value: Any) -> bool:
    """Put `value` under `name` into a stand-in that lacks it; False when it has it (or is
    the real package)."""
    names = module.__dict__
    if name in names or "__lean_completed__" in names or "__getattr__" not in names:
        return False
    names[name] = value
    return True


def config_module(module: str) -> ModuleType:
    """`kubernetes.config.<module>`, imported without the rest of the package."""
    name = f"kubernetes.config.{module}"
    with _lock:
        if name in sys.modules:
            return sys.modules[name]
        if "kubernetes" not in sys.modules:
            _install()
        if module == "kube_config" and not any(m in sys.modules for m in _OAUTH_PACKAGES):
            with contextlib.suppress(ModuleNotFoundError):  # then the import below says so
                _install(_OAUTH_PACKAGES)
        # kubernetes.config's modules import Configuration and ApiClient by name from the
        # client package, the kubeconfig one OAuth2Session too: the real Configuration stays;
        # the deferred ApiClient and OAuth2Session are offered only during this import, so
        # everyone else still gets the real classes
        client = sys.modules["kubernetes.client"]
        if "Configuration" not in client.__dict__:
            configuration = importlib.import_module("kubernetes.client.configuration")
            client.__dict__["Configuration"] = configuration.Configuration
        lent = [(client, "ApiClient")] if _lend(client, "ApiClient", _api_client) else []
        oauth = sys.modules.get("requests_oauthlib")
        if oauth is not None and _lend(oauth, "OAuth2Session", _oauth2_session):
            lent.append((oauth, "OAuth2Session"))
        try:
            return importlib.import_module(name)
        finally:
            for owner, lent_name in lent:
                del owner.__dict__[lent_name]
