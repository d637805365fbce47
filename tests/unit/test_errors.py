"""Every exception class lives in metricvault.errors, whose docstring draws the tree, and is
imported from there; every error a client may retry is a RetryLater that the gateway answers
with Retry-After."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
from pathlib import Path

import pytest

from metricvault import errors
from metricvault.config import Settings
from metricvault.server.app import Gateway
from metricvault.store.vault import Vault

SRC = Path(errors.__file__).parent
# warnings (UserWarning and kin) are categories for ``warnings.warn``, never raised: not errors
BUILTIN_EXCEPTIONS = {
    name
    for name, obj in vars(builtins).items()
    if isinstance(obj, type) and issubclass(obj, BaseException) and not issubclass(obj, Warning)
}
ERROR_CLASSES = {
    name: obj
    for name, obj in vars(errors).items()
    if isinstance(obj, type)
    and issubclass(obj, BaseException)
    and not issubclass(obj, Warning)  # warning categories (ApproximateAnswer) are not raised
    and obj.__module__ == errors.__name__
}
# Where some classes were once defined: those modules use them but no longer offer them.
FORMER_HOMES = {
    "ReadOnlyError": "metricvault.archive.opened",
    "SpoolLockedError": "metricvault.collect.spool",
    "NvmlUnavailable": "metricvault.collect.sources.nvml",
    "CorruptBatch": "metricvault.store.buffer",
}


def _exception_classes_outside_errors() -> list[str]:
    """Public classes deriving from a builtin exception or a metricvault error, by AST."""
    exception_names = BUILTIN_EXCEPTIONS | set(ERROR_CLASSES)
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path == Path(errors.__file__):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = {
                b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases
            }
            if bases & exception_names:
                found.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}")
    return found


def _error_imports_from_elsewhere() -> list[str]:
    """Imports of a metricvault error class from any module but metricvault.errors, by AST."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module != errors.__name__:
                found += [
                    f"{path.relative_to(SRC)}:{node.lineno} {alias.name} from {node.module}"
                    for alias in node.names
                    if alias.name in ERROR_CLASSES
                ]
    return found


def test_every_public_exception_class_is_defined_in_errors_py():
    assert _exception_classes_outside_errors() == []


def test_every_module_imports_error_classes_from_errors_py():
    assert _error_imports_from_elsewhere() == []


@pytest.mark.parametrize("name", sorted(FORMER_HOMES))
def test_a_former_home_of_an_error_class_does_not_offer_it(name):
    module = importlib.import_module(FORMER_HOMES[name])
    assert name not in getattr(module, "__all__", ()), f"{module.__name__} re-exports {name}"
    assert f"import {name} as {name}" not in Path(str(module.__file__)).read_text()


def test_promql_has_no_errors_module_of_its_own():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("metricvault.promql.errors")


def _tree() -> list[tuple[int, str]]:
    """(depth, class name) for each line of the tree drawn in the errors.py docstring."""
    rows = []
    for line in (errors.__doc__ or "").splitlines():
        match = re.match(r"^    ([│├└─ ]*)([A-Z]\w+)", line)
        if match and (match.group(1) or match.group(2) == "MetricVaultError"):
            rows.append((len(match.group(1)) // 4, match.group(2)))
    return rows


def test_the_errors_docstring_draws_every_class_under_its_base():
    rows = _tree()
    assert {name for _, name in rows} == set(ERROR_CLASSES)
    parents: list[str] = []
    for depth, name in rows:
        parents[depth:] = [name]
        if depth:
            base = ERROR_CLASSES[parents[depth - 1]]
            assert base in ERROR_CLASSES[name].__bases__, f"{name} is drawn under {base.__name__}"


def test_every_metricvault_error_says_its_http_status():
    for name, cls in ERROR_CLASSES.items():
        assert issubclass(cls, errors.MetricVaultError), name
        status = cls("m").status
        assert 400 <= status <= 599, name


@pytest.mark.parametrize(
    ("cls", "status", "default_wait"),
    [
        (errors.CardinalityError, 429, 60),
        (errors.BackpressureError, 503, 5),
        (errors.DiskFullError, 503, 30),
    ],
)
def test_rate_limit_backpressure_and_disk_full_are_retry_later(cls, status, default_wait):
    assert issubclass(cls, errors.RetryLater)
    assert (cls("m").status, cls("m").retry_after_s, cls("m", 7).retry_after_s) == (
        status,
        default_wait,
        7,
    )
    assert "retry_after_s" in inspect.signature(cls).parameters


def test_only_retry_later_errors_carry_retry_after_s():
    carriers = {n for n, c in ERROR_CLASSES.items() if hasattr(c("m"), "retry_after_s")}
    assert carriers == {n for n, c in ERROR_CLASSES.items() if issubclass(c, errors.RetryLater)}
    assert issubclass(errors.DiskFullError, errors.StorageError)  # still caught as one


def test_moved_runtime_errors_are_still_runtime_errors():
    for cls in (errors.SpoolLockedError, errors.NvmlUnavailable):
        with pytest.raises(RuntimeError, match="held"):
            raise cls("held")


class _QuotaError(errors.RetryLater):
    """A RetryLater the gateway has never heard of: the base alone must set Retry-After."""

    status = 429


@pytest.mark.parametrize(
    ("exc", "retry_after"),
    [
        (_QuotaError("over quota", retry_after_s=9), "9"),
        (errors.DiskFullError("disk full"), "30"),
        (errors.TooLargeError("too big"), None),
    ],
)
def test_the_gateway_sets_retry_after_from_the_retry_later_base(tmp_path, exc, retry_after):
    settings = Settings.load(env={}, gateway_maintain=False)
    with Vault.open_local(str(tmp_path / "v"), settings) as vault:
        response = Gateway(vault, settings).refuse(exc)
    assert response.status_code == exc.status
    assert response.headers.get("retry-after") == retry_after
