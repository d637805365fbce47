"""The gateway's experiments API: a typed request schema and tenant scoping.

A request body is checked field by field against :data:`FIELDS` (unknown field, wrong type:
400 naming it), so nothing the client sends reaches the registry as an unchecked keyword
(``now`` or ``created_ms`` cannot forge the creation time). A credential with a tenant sees,
creates and changes only its tenant's experiments, and every selector it stores is confined
to its tenant: ``tenant_label="<tenant>"`` is ANDed into each ``or`` part, so the experiment
cannot reach another tenant's series.
"""

from __future__ import annotations

from typing import Any

from metricvault.errors import InputError, NotFoundError
from metricvault.experiment import EDITABLE, Experiment, unknown_message
from metricvault.selector import Matcher, Selector, SelectorUnion, parse_selectors

_TIME = "a time (ISO 8601 string, epoch milliseconds or a relative time like '-1h')"
# field -> (accepted JSON types, how the error names them)
FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "id": ((str,), "a string (a slug such as 'llama-70b-r3')"),
    "selector": ((str,), "a string (a PromQL series selector)"),
    "name": ((str,), "a string"),
    "start": ((str, int, float), _TIME),
    "end": ((str, int, float, type(None)), _TIME + " or null (running)"),
    "git_repo": ((str,), "a string"),
    "git_sha": ((str,), "a string (a commit id)"),
    "owner": ((str,), "a string"),
    "tags": ((list,), "a list of strings"),
    "notes": ((str,), "a string"),
    "params": ((dict,), "a JSON object"),
}
CREATE_FIELDS = tuple(FIELDS)
UPDATE_FIELDS = EDITABLE


def checked_fields(body: dict[str, Any], allowed: tuple[str, ...]) -> dict[str, Any]:
    """The fields of a request body, each of a known name and type, else InputError."""
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise InputError(
            f"unknown experiment field(s) {', '.join(map(repr, unknown))}; the fields are "
            f"{', '.join(allowed)}"
        )
    fields: dict[str, Any] = {}
    for name, value in body.items():
        types, expected = FIELDS[name]
        # JSON true/false arrive as bool, a subclass of int: never a time
        if isinstance(value, bool) or not isinstance(value, types):
            raise InputError(
                f"experiment field {name!r} must be {expected}, got {type(value).__name__} "
                f"{str(value)[:60]!r}"
            )
        if isinstance(value, list):  # tags
            if not all(isinstance(tag, str) for tag in value):
                raise InputError(f"experiment field 'tags' must be {expected}, got {value!r:.80}")
            value = tuple(value)
        fields[name] = value
    return fields


def confine(selector: str, label: str, tenant: str) -> str:
    """``selector`` with ``label="tenant"`` ANDed into every ``or`` part (none: unchanged)."""
    if not tenant:
        return selector
    own = Matcher(label, "=", tenant)
    parts = [
        p if own in p.matchers else Selector((*p.matchers, own))
        for p in parse_selectors(selector).parts
    ]
    return str(SelectorUnion(tuple(parts)))


def visible(experiments: list[Experiment], tenant: str) -> list[Experiment]:
    return [e for e in experiments if e.tenant == tenant]


def own(exp: Experiment, tenant: str, ids: list[str]) -> Experiment:
    """``exp`` if it belongs to ``tenant``; otherwise 404 exactly as for an unknown id (the
    answer must not tell another tenant's ids from free ones)."""
    if exp.tenant != tenant:
        raise NotFoundError(unknown_message(exp.id, ids, "this gateway"))
    return exp
