"""How :class:`~memory_pipelines.service.MemoryService` is composed of parts.

A part is a public sub-object of the service (``svc.directory``, ``svc.notes_admin``,
``svc.api_keys``) that holds one group of calls, written once. Declaring it on the class
with :func:`part` also makes each of its public methods a name of the service itself, so
``svc.configure_agent(...)`` is ``svc.directory.configure_agent(...)``: a call added to a
part is a call of the facade, with its signature and docstring (``help()``,
``inspect.signature``) and nothing re-declared.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy as np

    from memory_pipelines.admin import Registry
    from memory_pipelines.context import MemoryContext
    from memory_pipelines.notebook import Notebook
    from memory_pipelines.notes import Example, Note
    from memory_pipelines.sources import Sources

P = TypeVar("P")


class Host(Protocol):
    """What a part reads of the service it belongs to."""

    sources: Sources
    registry: Registry
    notebook: Notebook

    @property
    def context(self) -> MemoryContext: ...

    def get_note(self, note_id: str) -> Note | None: ...

    def save_examples(
        self, examples: Sequence[Example], vectors: np.ndarray | None = None
    ) -> list[Example]: ...


class Delegated:
    """A facade name: on an instance, the bound method of its part (``svc.<via>.<name>``);
    on the class, a function of the service with the part's signature and docstring (it
    calls the part), so ``help()``, ``inspect.signature`` and ``MemoryService.<name>(svc,
    ...)`` work as for a method defined on the class."""

    def __init__(self, via: str, function: Callable[..., Any]):
        self.via = via
        name = function.__name__

        @functools.wraps(function)
        def call(service: Any, /, *args: Any, **kwargs: Any) -> Any:
            return getattr(getattr(service, via), name)(*args, **kwargs)

        self.function = call
        functools.update_wrapper(self, function)

    def __get__(self, obj: object, owner: type | None = None) -> Any:
        if obj is None:
            return self.function
        return getattr(getattr(obj, self.via), self.__name__)

    def __repr__(self) -> str:
        return f"<facade name {self.__name__} of part {self.via}>"


class Part(Generic[P]):
    """A part of the service, built on first use from the service (``cls(service)``) and
    kept; its public methods become names of the owning class (see the module)."""

    def __init__(self, cls: type[P]):
        self.cls = cls
        self.__doc__ = cls.__doc__
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        for method, function in inspect.getmembers(self.cls, inspect.isfunction):
            if method.startswith("_"):
                continue
            clash = getattr(owner, method, None)
            if clash is not None:
                raise TypeError(
                    f"{owner.__name__}.{method} is already defined; part {name!r} cannot also"
                    f" provide it ({clash!r})"
                )
            setattr(owner, method, Delegated(name, function))

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Part[P]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> P: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Part[P] | P:
        if obj is None:
            return self
        made = obj.__dict__.get(self.name)
        if made is None:
            made = obj.__dict__[self.name] = self.cls(obj)
        return made


def part(cls: type[P]) -> Part[P]:
    """Declare ``cls`` a part of the class being defined (``directory = part(Directory)``)."""
    return Part(cls)


def delegated_names(owner: type) -> dict[str, str]:
    """Every facade name of ``owner`` with the part that provides it."""
    return {name: attr.via for name, attr in vars(owner).items() if isinstance(attr, Delegated)}
