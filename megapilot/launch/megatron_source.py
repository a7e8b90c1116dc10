"""A Megatron-LM checkout's flags, read from its source without importing it (no torch, no Megatron).

`--megatron-path` points at the code that will run; reading its own `megatron/training/arguments.py`
checks the script against exactly that parser, whatever its release or local patches. The reader follows
what `add_megatron_arguments` does at parser-build time:
- every `add_argument(...)` call of the `_add_*_args` functions it calls, with names, action, nargs,
  dest and choices evaluated from the source (literals, module constants, enum classes, `range`,
  comprehensions over enums);
- every `ArgumentGroupFactory(Config, exclude=[...]).build_group(...)` (core_v0.16.0 on): the dataclass
  fields of `Config` (and its bases, from their own files in the checkout) turned into options by the
  factory's rules (bool -> store_true, or store_false named --no-/--disable- when the default is true;
  Optional[X] -> X; list[X] -> nargs '+'; Literal / Enum -> choices; `argparse_meta` overrides last).
Its rows are the extractor's (`data/extract_megatron_args.py`), so a checkout of a released tag gives
that tag's committed table. Optional third-party features whose flags exist only when their package is
importable (Kitchen quantization) are read as absent, as on a machine without the package.
"""

from __future__ import annotations

import ast
import enum
import importlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from megapilot.errors import MegapilotError
from megapilot.launch.megatron_args import (
    SCRIPT_RELEASE_NAMES,
    FlagTable,
    MegatronFlag,
    ReleaseNames,
    Version,
    release_name,
)

ARGUMENTS_FILE = "megatron/training/arguments.py"
PACKAGE_INFO_FILE = "megatron/core/package_info.py"
_BOOL_ACTIONS = {"store_true": "store_true", "store_false": "store_false"}
_NO_VALUE_ACTIONS = {"store_const": "_StoreConstAction", "append_const": "_AppendConstAction",
                     "count": "_CountAction", "version": "_VersionAction", "help": "_HelpAction"}


class Unreadable(Exception):
    """A piece of source the reader does not evaluate (a dynamic value where a literal was expected)."""


@dataclass(frozen=True)
class EnumMember:
    """A member of an enum class defined in the checkout (or the stdlib), as the parser would see it."""

    name: str
    value: object


@dataclass(frozen=True)
class EnumClass:
    members: tuple[EnumMember, ...]


@dataclass(frozen=True)
class _Module:
    name: str
    tree: ast.Module
    is_package: bool


@dataclass
class _Scope:
    """Names visible while reading one function: its module's, then its own assignments."""

    module: _Module
    local: dict[str, object] = field(default_factory=dict)


def read_checkout_version(root: Path, names: ReleaseNames = SCRIPT_RELEASE_NAMES) -> Version:
    """MAJOR.MINOR.PATCH from the checkout's megatron/core/package_info.py (a checkout without one refused in the
    words of `names`, the command's)."""
    path = root / PACKAGE_INFO_FILE
    if not path.is_file():
        raise MegapilotError(f"{path} does not exist", field="megatron_path",
                             fix=f"point {names.path} at the root of a Megatron-LM checkout")
    values: dict[str, object] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    try:
        return int(str(values["MAJOR"])), int(str(values["MINOR"])), int(str(values["PATCH"]))
    except KeyError:
        raise MegapilotError(f"{path} does not define MAJOR, MINOR and PATCH", field="megatron_path",
                             fix=f"point {names.path} at a Megatron-LM checkout (core_v0.14.0 or newer)") from None


def read_checkout_table(root: Path, names: ReleaseNames = SCRIPT_RELEASE_NAMES) -> FlagTable:
    """Every flag of the checkout's `add_megatron_arguments`, read statically."""
    reader = SourceReader(root, names)
    return FlagTable(release=release_name(read_checkout_version(root, names)), commit=None,
                     flags=dict(sorted(reader.flags().items())), origin=str(root / ARGUMENTS_FILE))


class SourceReader:
    """Reads one checkout; remembers every file it parsed (`files_read`) so tests can keep just those."""

    def __init__(self, root: Path, names: ReleaseNames = SCRIPT_RELEASE_NAMES) -> None:
        self.root = root
        self.names = names  # how the command names the checkout, for the fix of one that is not a checkout
        self.files_read: set[str] = set()
        self._modules: dict[str, _Module | None] = {}

    # ---- the parser --------------------------------------------------------------------
    def flags(self) -> dict[str, MegatronFlag]:
        module = self._module("megatron.training.arguments")
        if module is None:
            raise MegapilotError(f"{self.root / ARGUMENTS_FILE} does not exist", field="megatron_path",
                                 fix=f"point {self.names.path} at the root of a Megatron-LM checkout")
        entry = _function(module, "add_megatron_arguments", self.names)
        rows: dict[str, MegatronFlag] = {}
        for call in _calls_in_order(entry.body):
            if isinstance(call.func, ast.Name) and _function_or_none(module, call.func.id) is not None:
                for row in self._read_function(module, call.func.id):
                    rows.update({flag.name: flag for flag in row})
        return rows

    def _read_function(self, module: _Module, name: str) -> Iterator[list[MegatronFlag]]:
        scope = _Scope(module)
        yield from self._read_statements(_function(module, name, self.names).body, scope)

    def _read_statements(self, body: list[ast.stmt], scope: _Scope) -> Iterator[list[MegatronFlag]]:
        for statement in body:
            if isinstance(statement, ast.ImportFrom):
                self._bind_import(statement, scope)
            elif isinstance(statement, ast.Try):
                yield from self._read_try(statement, scope)
            elif isinstance(statement, ast.If):
                if self._truth(statement.test, scope):
                    yield from self._read_statements(statement.body, scope)
                else:
                    yield from self._read_statements(statement.orelse, scope)
            elif isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                yield from self._read_assign(statement.targets[0], statement.value, scope)
            elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
                yield from self._read_call(statement.value, scope)
            elif isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Tuple):
                for element in statement.value.elts:  # `group.add_argument(...),` (a stray comma)
                    if isinstance(element, ast.Call):
                        yield from self._read_call(element, scope)
            elif isinstance(statement, (ast.With, ast.For)):
                yield from self._read_statements(statement.body, scope)

    def _read_try(self, statement: ast.Try, scope: _Scope) -> Iterator[list[MegatronFlag]]:
        """`try: from X import Y` — the body holds when every import resolves to a file of the checkout."""
        imports = [s for s in statement.body if isinstance(s, ast.ImportFrom)]
        if all(self._module(_absolute(s, scope.module)) is not None for s in imports):
            yield from self._read_statements(statement.body, scope)
        else:
            for handler in statement.handlers:
                yield from self._read_statements(handler.body, scope)

    def _read_assign(self, target: ast.expr, value: ast.expr, scope: _Scope) -> Iterator[list[MegatronFlag]]:
        if isinstance(value, ast.Call):
            factory = self._factory_call(value, scope)
            if factory is not None and isinstance(target, ast.Name):
                scope.local[target.id] = factory
                return
            yield from self._read_call(value, scope)
        if isinstance(target, ast.Name):
            try:
                scope.local[target.id] = self._evaluate(value, scope)
            except Unreadable:
                scope.local.pop(target.id, None)

    def _read_call(self, call: ast.Call, scope: _Scope) -> Iterator[list[MegatronFlag]]:
        if not isinstance(call.func, ast.Attribute):
            return
        if call.func.attr == "add_argument":
            yield self._argument(call, scope)
        elif call.func.attr == "build_group":
            owner = call.func.value
            factory = (self._factory_call(owner, scope) if isinstance(owner, ast.Call)
                       else scope.local.get(owner.id) if isinstance(owner, ast.Name) else None)
            if isinstance(factory, _Factory):
                yield from self._dataclass_options(factory)

    # ---- add_argument ------------------------------------------------------------------
    def _argument(self, call: ast.Call, scope: _Scope) -> list[MegatronFlag]:
        strings = [self._evaluate(a, scope) for a in call.args]
        keywords = {k.arg: k.value for k in call.keywords if k.arg is not None}
        action = self._action_name(keywords.get("action"), scope)
        nargs = self._evaluate(keywords["nargs"], scope) if "nargs" in keywords else None
        dest = self._evaluate(keywords["dest"], scope) if "dest" in keywords else _dest_of([str(s) for s in strings])
        choices = None
        if "choices" in keywords:
            choices = self._evaluate(keywords["choices"], scope)
        return _row([str(s) for s in strings], str(dest), action, nargs, choices,
                     self._choice_type(keywords.get("type"), scope))

    def _action_name(self, node: ast.expr | None, scope: _Scope) -> str:
        if node is None:
            return "store"
        if isinstance(node, ast.Attribute) and node.attr == "BooleanOptionalAction":
            return "BooleanOptionalAction"
        value = self._evaluate(node, scope)
        return str(value)

    def _choice_type(self, node: ast.expr | None, scope: _Scope) -> str:
        """How a `type=` maps typed text back to an enum choice: by member name, by value, or not at all."""
        if node is None:
            return "none"
        if isinstance(node, ast.Lambda) and isinstance(node.body, ast.Subscript):
            return "name"
        try:
            if isinstance(self._evaluate(node, scope), EnumClass):
                return "value"
        except Unreadable:
            pass
        return "other"

    # ---- ArgumentGroupFactory ----------------------------------------------------------
    def _factory_call(self, call: ast.Call, scope: _Scope) -> _Factory | None:
        if not (isinstance(call.func, ast.Name) and call.func.id == "ArgumentGroupFactory"):
            return None
        config = call.args[0] if call.args else next(k.value for k in call.keywords if k.arg == "src_cfg_class")
        exclude_node = next((k.value for k in call.keywords if k.arg == "exclude"),
                            call.args[1] if len(call.args) > 1 else None)
        exclude = self._evaluate(exclude_node, scope) if exclude_node is not None else []
        located = self._class_of(config, scope)
        if located is None:
            raise Unreadable(f"dataclass {ast.unparse(config)}")
        return _Factory(located[0], located[1], frozenset(str(e) for e in _iterate(exclude or [])))

    def _dataclass_options(self, factory: _Factory) -> Iterator[list[MegatronFlag]]:
        for name, (annotation, default, metadata, module) in self._fields(factory.module, factory.cls).items():
            if name in factory.exclude:
                continue
            yield self._field_option(name, annotation, default, metadata, module)

    def _fields(
        self, module: _Module, cls: ast.ClassDef
    ) -> dict[str, tuple[ast.expr, object, dict[str, ast.expr], _Module]]:
        """Dataclass fields in dataclasses' order: bases' first, a redefinition keeps its first place."""
        fields: dict[str, tuple[ast.expr, object, dict[str, ast.expr], _Module]] = {}
        scope = _Scope(module)
        for base in cls.bases:
            located = self._class_of(base, scope)
            if located is not None:
                fields.update(self._fields(*located))
        for statement in cls.body:
            if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
                continue
            if _is_class_var(statement.annotation):
                continue
            default, metadata, init = self._field_default(statement.value, scope)
            if not init:
                fields.pop(statement.target.id, None)
                continue
            fields[statement.target.id] = (statement.annotation, default, metadata, module)
        return fields

    def _field_default(self, node: ast.expr | None, scope: _Scope) -> tuple[object, dict[str, ast.expr], bool]:
        """(default, metadata, init) of one field; a default the reader cannot evaluate is `Unreadable`."""
        if not (isinstance(node, ast.Call) and _call_name(node) == "field"):
            return self._evaluate_or_unknown(node, scope), {}, True
        keywords = {k.arg: k.value for k in node.keywords if k.arg is not None}
        init = "init" not in keywords or self._evaluate_or_unknown(keywords["init"], scope) is not False
        default = self._evaluate_or_unknown(keywords["default"], scope) if "default" in keywords else _UNKNOWN
        metadata = {}
        if "metadata" in keywords and isinstance(keywords["metadata"], ast.Dict):
            for key, value in zip(keywords["metadata"].keys, keywords["metadata"].values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "argparse_meta" and isinstance(value, ast.Dict):
                    metadata = {str(self._evaluate(k, scope)): v for k, v in zip(value.keys, value.values, strict=True)
                                if k is not None}
        return default, metadata, init

    def _field_option(self, name: str, annotation: ast.expr, default: object, metadata: dict[str, ast.expr],
                      module: _Module) -> list[MegatronFlag]:
        scope = _Scope(module)
        names = ["--" + name.replace("_", "-")]
        action, nargs, choices, choice_type = "store", None, None, "none"
        try:
            kind = self._field_type(annotation, scope)
            if kind.is_bool:
                action = "store_true" if default is False else "store_false"
                if action == "store_false":
                    names = ["--no-" + name.replace("_", "-"), "--disable-" + name.replace("_", "-")]
            nargs, choices, choice_type = kind.nargs, kind.choices, kind.choice_type
        except Unreadable:
            if not metadata:
                raise
        dest: object = name
        for key, value in metadata.items():
            if key == "arg_names":
                names = [str(n) for n in _iterate(self._evaluate(value, scope))]
            elif key == "nargs":
                nargs = self._evaluate(value, scope)
            elif key == "choices":
                choices, choice_type = self._evaluate(value, scope), "name"
            elif key == "action":
                action = self._action_name(value, scope)
            elif key == "dest":
                dest = self._evaluate(value, scope)
        return _row(names, str(dest), action, nargs, choices, choice_type)

    def _field_type(self, node: ast.expr, scope: _Scope) -> _FieldType:
        """The factory's _extract_type on an annotation read from source."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node = ast.parse(node.value, mode="eval").body
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # X | None
            if _is_none(node.right):
                return self._field_type(node.left, scope)
            raise Unreadable("union")
        if isinstance(node, ast.Subscript):
            origin = _dotted(node.value).rsplit(".", 1)[-1]
            arguments = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
            if origin in ("Optional",):
                return self._field_type(arguments[0], scope)
            if origin == "Union":
                if len(arguments) > 1 and _is_none(arguments[1]):
                    return self._field_type(arguments[0], scope)
                raise Unreadable("union")
            if origin in ("list", "List") and len(arguments) == 1:
                inner = self._field_type(arguments[0], scope)
                return _FieldType(False, "+", inner.choices, inner.choice_type)
            if origin == "Literal":
                return _FieldType(False, None, [self._evaluate(a, scope) for a in arguments], "none")
            raise Unreadable(f"type {ast.unparse(node)}")
        if isinstance(node, ast.Name) and node.id == "bool":
            return _FieldType(True, None, None, "none")
        if isinstance(node, (ast.Name, ast.Attribute)):
            try:
                target = self._evaluate(node, scope)
            except Unreadable:
                return _FieldType(False, None, None, "none")  # a plain type (int, str, torch.dtype, ...)
            if isinstance(target, EnumClass):
                return _FieldType(False, None, list(target.members), "name")
            return _FieldType(False, None, None, "none")
        raise Unreadable(f"type {ast.unparse(node)}")

    # ---- evaluation ----------------------------------------------------------------------
    def _evaluate_or_unknown(self, node: ast.expr | None, scope: _Scope) -> object:
        if node is None:
            return _UNKNOWN
        try:
            return self._evaluate(node, scope)
        except Unreadable:
            return _UNKNOWN

    def _evaluate(self, node: ast.expr, scope: _Scope) -> object:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return [self._evaluate(e, scope) for e in node.elts]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            value = self._evaluate(node.operand, scope)
            if isinstance(value, (int, float)):
                return -value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self._evaluate(node.left, scope), self._evaluate(node.right, scope)
            if isinstance(left, list) and isinstance(right, list):
                return left + right
        if isinstance(node, ast.Name):
            return self._name(node.id, scope)
        if isinstance(node, ast.Attribute):
            return self._attribute(node, scope)
        if isinstance(node, ast.Call):
            return self._call(node, scope)
        if isinstance(node, ast.ListComp) and len(node.generators) == 1:
            return self._comprehension(node, scope)
        raise Unreadable(ast.unparse(node))

    def _name(self, name: str, scope: _Scope) -> object:
        if name in scope.local:
            return scope.local[name]
        if name in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[name]
        return self._module_name(scope.module, name, depth=0)

    def _module_name(self, module: _Module, name: str, depth: int) -> object:
        """A module-level name: an import (followed into the checkout), a class, or a constant."""
        if depth > 8:
            raise Unreadable(name)
        for statement in module.tree.body:
            if isinstance(statement, ast.ClassDef) and statement.name == name:
                return self._class_value(module, statement)
            if isinstance(statement, ast.ImportFrom):
                for alias in statement.names:
                    if (alias.asname or alias.name) == name:
                        return self._imported(_absolute(statement, module), alias.name, depth)
            if isinstance(statement, ast.Import):
                for alias in statement.names:
                    if (alias.asname or alias.name.split(".")[0]) == name:
                        return _StdlibModule(alias.name if alias.asname else name)
            if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name) and statement.targets[0].id == name):
                return self._evaluate(statement.value, _Scope(module))
        raise Unreadable(name)

    def _imported(self, module_name: str, name: str, depth: int) -> object:
        module = self._module(module_name)
        if module is not None:
            return self._module_name(module, name, depth + 1)
        submodule = self._module(f"{module_name}.{name}")
        if submodule is not None:
            return submodule
        return _stdlib_attribute(module_name, name)

    def _attribute(self, node: ast.Attribute, scope: _Scope) -> object:
        owner = self._evaluate(node.value, scope)
        if isinstance(owner, _StdlibModule):
            return _stdlib_attribute(owner.name, node.attr)
        if isinstance(owner, _Module):
            return self._module_name(owner, node.attr, depth=0)
        if isinstance(owner, EnumClass):
            for member in owner.members:
                if member.name == node.attr:
                    return member
        raise Unreadable(ast.unparse(node))

    def _call(self, node: ast.Call, scope: _Scope) -> object:
        function = _call_name(node)
        arguments = [self._evaluate(a, scope) for a in node.args]
        if function in ("list", "tuple", "sorted", "set") and len(arguments) == 1:
            return list(_iterate(arguments[0]))
        numbers = [a for a in arguments if isinstance(a, int)]
        if function == "range" and len(numbers) == len(arguments):
            return list(range(*numbers))
        raise Unreadable(ast.unparse(node))

    def _comprehension(self, node: ast.ListComp, scope: _Scope) -> object:
        generator = node.generators[0]
        if generator.ifs or not isinstance(generator.target, ast.Name):
            raise Unreadable(ast.unparse(node))
        items = []
        for item in _iterate(self._evaluate(generator.iter, scope)):
            inner = _Scope(scope.module, {**scope.local, generator.target.id: item})
            items.append(self._member_part(node.elt, inner))
        return items

    def _member_part(self, node: ast.expr, scope: _Scope) -> object:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            item = self._name(node.value.id, scope)
            if isinstance(item, EnumMember) and node.attr in ("value", "name"):
                return item.value if node.attr == "value" else item.name
        return self._evaluate(node, scope)

    def _truth(self, node: ast.expr, scope: _Scope) -> bool:
        """An `if` test: names bound by an availability probe (`try: import ...`) or constants."""
        try:
            value = self._evaluate(node, scope)
        except Unreadable:
            return False  # an optional package's flag (HAVE_X from a module probing a third-party import)
        return bool(value) if isinstance(value, (bool, int, str, type(None))) else False

    # ---- classes and modules -------------------------------------------------------------
    def _class_of(self, node: ast.expr, scope: _Scope) -> tuple[_Module, ast.ClassDef] | None:
        try:
            value = self._evaluate(node, scope)
        except Unreadable:
            return None
        return value.located if isinstance(value, _ClassValue) else None

    def _class_value(self, module: _Module, cls: ast.ClassDef) -> object:
        if self._is_enum(module, cls, depth=0):
            return EnumClass(tuple(self._enum_members(module, cls)))
        return _ClassValue((module, cls))

    def _is_enum(self, module: _Module, cls: ast.ClassDef, depth: int) -> bool:
        for base in cls.bases:
            name = _dotted(base).rsplit(".", 1)[-1]
            if name in ("Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"):
                return True
            located = self._class_of(base, _Scope(module))
            if located is not None and depth < 5 and self._is_enum(*located, depth=depth + 1):
                return True
        return False

    def _enum_members(self, module: _Module, cls: ast.ClassDef) -> Iterator[EnumMember]:
        counter = 0
        for statement in cls.body:
            if not (isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name)):
                continue
            name = statement.targets[0].id
            if name.startswith("_"):
                continue
            if isinstance(statement.value, ast.Call) and _call_name(statement.value) == "auto":
                counter += 1
                yield EnumMember(name, counter)
            else:
                yield EnumMember(name, self._evaluate_or_unknown(statement.value, _Scope(module)))

    def _bind_import(self, statement: ast.ImportFrom, scope: _Scope) -> None:
        for alias in statement.names:
            try:
                scope.local[alias.asname or alias.name] = self._imported(_absolute(statement, scope.module),
                                                                         alias.name, 0)
            except Unreadable:
                scope.local.pop(alias.asname or alias.name, None)

    def _module(self, name: str) -> _Module | None:
        if name in self._modules:
            return self._modules[name]
        relative = Path(*name.split("."))
        module = None
        for path, is_package in ((relative.with_suffix(".py"), False), (relative / "__init__.py", True)):
            if name.split(".")[0] == "megatron" and (self.root / path).is_file():
                self.files_read.add(path.as_posix())
                module = _Module(name, ast.parse((self.root / path).read_text()), is_package)
                break
        self._modules[name] = module
        return module


@dataclass(frozen=True)
class _Factory:
    module: _Module
    cls: ast.ClassDef
    exclude: frozenset[str]


@dataclass(frozen=True)
class _FieldType:
    is_bool: bool
    nargs: object
    choices: object
    choice_type: str


@dataclass(frozen=True)
class _ClassValue:
    located: tuple[_Module, ast.ClassDef]


@dataclass(frozen=True)
class _StdlibModule:
    name: str


_UNKNOWN = object()


def _stdlib_attribute(module_name: str, name: str) -> object:
    """An attribute of a standard-library module (signal.Signals): imported, it is ours to read."""
    if module_name.split(".")[0] not in sys.stdlib_module_names:
        raise Unreadable(f"{module_name}.{name}")
    value = getattr(importlib.import_module(module_name), name, _UNKNOWN)
    if isinstance(value, type) and issubclass(value, enum.Enum):
        return EnumClass(tuple(EnumMember(m.name, m.value) for m in value))
    if value is _UNKNOWN or not isinstance(value, (int, float, str, bool, type(None))):
        raise Unreadable(f"{module_name}.{name}")
    return value


def _iterate(value: object) -> list[object]:
    if isinstance(value, EnumClass):
        return list(value.members)
    if isinstance(value, list):
        return value
    raise Unreadable(repr(value))


def _row(names: list[str], dest: str, action: str, nargs: object, choices: object,
         choice_type: str) -> list[MegatronFlag]:
    """One option as the extractor records it (`_describe`), from what add_argument was given."""
    long_names = sorted(n for n in names if n.startswith("--"))
    if action == "BooleanOptionalAction":
        long_names = sorted(long_names + ["--no-" + n[2:] for n in long_names])
        nargs = 0
    elif action in _BOOL_ACTIONS or action in _NO_VALUE_ACTIONS:
        nargs = 0
    takes_value = nargs != 0
    recorded = _BOOL_ACTIONS.get(action) or ("store" if takes_value else _NO_VALUE_ACTIONS.get(action, action))
    texts = None
    if choices:
        texts = tuple(sorted(_choice_text(c, choice_type) for c in _iterate(choices)))
    return [MegatronFlag(name=name, dest=dest, action=recorded, takes_value=takes_value,
                         nargs=nargs if isinstance(nargs, (int, str)) else None, choices=texts)
            for name in long_names]


def _choice_text(choice: object, choice_type: str) -> str:
    """What a user types for `choice` (the extractor's rule: an enum member by name unless `type` maps
    values back to members)."""
    if isinstance(choice, EnumMember):
        return str(choice.value) if choice_type == "value" else choice.name
    return str(choice)


def _dest_of(names: list[str]) -> str:
    """argparse's dest: the first long option without dashes, '-' -> '_'."""
    long_names = [n for n in names if n.startswith("--")]
    return (long_names or names)[0].lstrip("-").replace("-", "_")


def _function(module: _Module, name: str, names: ReleaseNames) -> ast.FunctionDef:
    found = _function_or_none(module, name)
    if found is None:
        raise MegapilotError(f"{module.name} has no {name}()", field="megatron_path",
                             fix=f"point {names.path} at a Megatron-LM checkout (core_v0.14.0 or newer)")
    return found


def _function_or_none(module: _Module, name: str) -> ast.FunctionDef | None:
    for node in module.tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _calls_in_order(body: list[ast.stmt]) -> Iterator[ast.Call]:
    for statement in body:
        value = statement.value if isinstance(statement, (ast.Assign, ast.Expr)) else None
        if isinstance(value, ast.Call):
            yield value


def _call_name(node: ast.Call) -> str:
    return _dotted(node.func).rsplit(".", 1)[-1]


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _is_none(node: ast.expr) -> bool:
    return (isinstance(node, ast.Constant) and node.value is None) or (isinstance(node, ast.Name) and node.id == "None")


def _is_class_var(node: ast.expr) -> bool:
    target = node.value if isinstance(node, ast.Subscript) else node
    return _dotted(target).rsplit(".", 1)[-1] in ("ClassVar", "InitVar")


def _absolute(statement: ast.ImportFrom, module: _Module) -> str:
    """The absolute module name of `from <statement.module> import ...` inside `module`."""
    if not statement.level:
        return statement.module or ""
    parts = module.name.split(".")
    base = parts if module.is_package else parts[:-1]
    base = base[: len(base) - (statement.level - 1)]
    return ".".join(base + ([statement.module] if statement.module else []))
