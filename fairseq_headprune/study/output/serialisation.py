"""Records as JSON holds them: one mechanism, read from each dataclass's fields and their annotations, writes and
reads every record the project keeps on disk (a stage's ``stage.json``, a run's ``report.json``).

Writing (``to_plain``): a dataclass becomes a dict of its fields in their order, nested records, lists and dicts
likewise (dict keys as text: a batch size 64 is ``"64"``), then the properties its class names in ``DERIVED``,
then the keys kept in its ``UNKNOWN_KEYS`` field. Reading (``from_plain``): each key is converted to its field's
annotation (a nested record, ``List[X]``, ``Dict[int, X]``, ``Optional[X]``; plain values as they are), a key an
older format named otherwise is renamed first (the class's ``RENAMED``), a whole older shape rewritten first (its
``upgrade``), and keys the class does not name are kept in its ``UNKNOWN_KEYS`` field where it has one and
dropped otherwise.

A field may say how it is written (``field(metadata=...)``): ``OMITTED_WHEN_DEFAULT`` leaves it out while it holds
its default (a fact older records lack), ``WRITTEN_LAST`` writes it after every other key, ``FLATTENED`` writes a
nested record's keys into its parent's, ``written_as(write, read)`` converts it both ways, ``NOT_WRITTEN`` keeps it
in memory only. A dataclass that is not a ``PlainRecord`` but has a ``to_dict`` of its own (a settings object's
identity, e.g. ``DeploymentSettings``) is written by it.
"""

import collections.abc
import dataclasses
import functools
import types
import typing
from typing import Any, Callable, ClassVar, Dict, Mapping, Tuple, Type, TypeVar

from fairseq_headprune.errors import ResultFileError

Plain = TypeVar("Plain", bound="PlainRecord")

OMITTED_WHEN_DEFAULT = {"omitted_when_default": True}
FLATTENED = {"flattened": True}
NOT_WRITTEN = {"not_written": True}
WRITTEN_LAST = {"written_last": True}
UNKNOWN_KEYS = {"unknown_keys": True}  # a dict field that keeps the keys its record's class does not name


def written_as(write: Callable[[Any], Any], read: Callable[[Any], Any]) -> Dict[str, Any]:
    """A field's metadata: ``write`` turns its value into what JSON holds, ``read`` back."""
    return {"written_as": (write, read)}


class PlainRecord:
    """A record written and read by ``to_plain``/``from_plain``. ``RENAMED``: an older format's key -> this one's;
    ``DERIVED``: properties written after the fields (read back by computing them again); ``ORDER``: the keys
    written first."""

    RENAMED: ClassVar[Dict[str, str]] = {}
    DERIVED: ClassVar[Tuple[str, ...]] = ()
    ORDER: ClassVar[Tuple[str, ...]] = ()  # the keys written first, in this order (then the others in theirs)

    def to_dict(self) -> Dict[str, Any]:
        return to_plain(self)

    @classmethod
    def from_dict(cls: Type[Plain], data: Mapping[str, Any]) -> Plain:
        return from_plain(cls, data)

    @classmethod
    def upgrade(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """An older format's record rewritten in this one's shape before it is read (as it is, by default)."""
        return data


def _default(spec: dataclasses.Field) -> Any:
    if spec.default is not dataclasses.MISSING:
        return spec.default
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return dataclasses.MISSING


def _required(spec: dataclasses.Field) -> bool:
    """Whether a field has no default (its record cannot be read without it)."""
    return spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING


def to_plain(value: Any) -> Any:
    """``value`` as JSON holds it (see the module's docstring)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # a record by this mechanism; a settings object by its own identity (e.g. DeploymentSettings.to_dict)
        return value.to_dict() if hasattr(value, "to_dict") and not isinstance(value, PlainRecord) \
            else _record_to_plain(value)
    if isinstance(value, Mapping):
        return {str(key): to_plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(item) for item in value]
    return value


def _record_to_plain(record: Any) -> Dict[str, Any]:
    """The fields in their order, the properties named in ``DERIVED``, the unknown keys kept, the fields written
    last; then the keys named in ``ORDER`` moved first."""
    specs = [spec for spec in dataclasses.fields(record) if not spec.metadata.get("not_written")]
    unknown = [spec for spec in specs if spec.metadata.get("unknown_keys")]
    specs = [spec for spec in specs if spec not in unknown]
    plain = _fields_to_plain(record, [spec for spec in specs if not spec.metadata.get("written_last")])
    plain.update({name: to_plain(getattr(record, name)) for name in getattr(record, "DERIVED", ())})
    for spec in unknown:
        plain.update(to_plain(getattr(record, spec.name) or {}))
    plain.update(_fields_to_plain(record, [spec for spec in specs if spec.metadata.get("written_last")]))
    order = getattr(record, "ORDER", ())
    return {**{key: plain[key] for key in order if key in plain}, **plain} if order else plain


def _fields_to_plain(record: Any, specs) -> Dict[str, Any]:
    plain: Dict[str, Any] = {}
    for spec in specs:
        value = getattr(record, spec.name)
        if spec.metadata.get("omitted_when_default") and value == _default(spec):
            continue
        if "written_as" in spec.metadata:
            plain[spec.name] = spec.metadata["written_as"][0](value)
        elif spec.metadata.get("flattened"):
            plain.update(to_plain(value))
        else:
            plain[spec.name] = to_plain(value)
    return plain


def from_plain(annotation: Any, data: Any) -> Any:
    """``data`` (as JSON holds it) read as ``annotation``: a record class, a typing form over them, or a plain
    type (taken as it is)."""
    if data is None:
        return None
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return from_plain(next(a for a in arguments if a is not type(None)), data)
    if origin in (list, collections.abc.Sequence) or annotation is list:
        return [from_plain(arguments[0] if arguments else Any, item) for item in data]
    if origin is tuple:
        item = arguments[0] if len(arguments) == 2 and arguments[1] is Ellipsis else Any
        return tuple(from_plain(item, value) for value in data)
    if origin in (dict, collections.abc.Mapping) or annotation is dict:
        key, item = arguments if arguments else (Any, Any)
        return {(int(k) if key is int else k): from_plain(item, value) for k, value in data.items()}
    if isinstance(annotation, type) and hasattr(annotation, "from_plain"):
        return annotation.from_plain(data)
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _record_from_plain(annotation, data)
    return data


def _record_from_plain(cls: type, data: Any) -> Any:
    if not isinstance(data, Mapping):
        raise ResultFileError(f"a {cls.__name__} record is a JSON object, not {type(data).__name__}")
    upgrade = getattr(cls, "upgrade", None)
    data = upgrade(data) if upgrade is not None else data
    hints = _hints(cls)
    specs = {spec.name: spec for spec in dataclasses.fields(cls) if spec.init}
    renamed, derived = getattr(cls, "RENAMED", {}), set(getattr(cls, "DERIVED", ()))
    flattened = [name for name, spec in specs.items() if spec.metadata.get("flattened")]
    unknown_field = next((name for name, spec in specs.items() if spec.metadata.get("unknown_keys")), None)
    values: Dict[str, Any] = {name: from_plain(hints[name], data) for name in flattened}
    unknown: Dict[str, Any] = {}
    for key, value in data.items():
        key = renamed.get(key, key)
        spec = specs.get(key)
        if spec is not None and key != unknown_field and key not in flattened:
            read = spec.metadata.get("written_as", (None, None))[1]
            values[key] = (read(value) if value is not None else None) if read else from_plain(hints[key], value)
        elif key not in derived and not any(_holds(hints[name], key) for name in flattened):
            unknown[key] = value
    if unknown_field is not None:
        values[unknown_field] = unknown
    missing = [name for name, spec in specs.items() if name not in values and _required(spec)]
    if missing:
        raise ResultFileError(f"a {cls.__name__} record lacks {', '.join(missing)}")
    return cls(**values)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> Dict[str, Any]:
    """A record class's fields' annotations, resolved once (a plan reads hundreds of candidates)."""
    return typing.get_type_hints(cls)


def _holds(annotation: Any, key: str) -> bool:
    """Whether a flattened record of ``annotation`` writes ``key`` (a field of it or one it derives)."""
    if not dataclasses.is_dataclass(annotation):
        return False
    return key in {spec.name for spec in dataclasses.fields(annotation)} or key in getattr(annotation, "DERIVED", ())
