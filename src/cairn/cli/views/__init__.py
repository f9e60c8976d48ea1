"""What each command prints: a rich table for people, one JSON document for scripts.

Every ``*_doc`` function returns the JSON document of a command (plain dicts and lists,
ids as strings, times as ISO 8601 and milliseconds); every ``*_table`` function the rich
renderable for the same facts, with sizes and ages in human units. The printed document
also carries ``schema_version`` and, on failure, ``error`` (:class:`cairn.cli.output.Output`);
:func:`json_schema` is each command's JSON Schema. Names that come
from the store (operators, sources) are always printed as plain text, never as markup.
A time with no date (beyond year 9999) is never an error: ``created`` is null in JSON
and the raw milliseconds for people.

The modules, one for what each group of commands shows:

* :mod:`~cairn.cli.views.summary`: one checkpoint in the words every output uses;
* :mod:`~cairn.cli.views.listing`: ``list``;
* :mod:`~cairn.cli.views.show`: ``show``, whole or summarised;
* :mod:`~cairn.cli.views.transfers`: ``verify``, ``restore``, ``copy``;
* :mod:`~cairn.cli.views.collection`: ``delete``, ``gc``;
* :mod:`~cairn.cli.views.schemas`: the JSON Schemas.

(``history`` draws its chart in :mod:`cairn.cli.history`.)
"""

from __future__ import annotations

from cairn.cli.views.collection import FOREIGN_SHOWN, delete_doc, delete_text, gc_doc, gc_table
from cairn.cli.views.listing import list_doc, list_table
from cairn.cli.views.schemas import COMMANDS_WITH_SCHEMAS, json_schema
from cairn.cli.views.show import (
    SHOW_ENTRIES_LIMIT,
    SHOW_ROWS_LIMIT,
    directory_summaries,
    operator_summaries,
    show_doc,
    show_lists_entries,
    show_table,
    signature_text,
)
from cairn.cli.views.summary import (
    FULL,
    INCREMENTAL,
    REQUEST_KINDS,
    artifacts_text,
    cost_doc,
    id_table,
    id_texts,
    kind,
    manifest_doc,
    requests_text,
)
from cairn.cli.views.transfers import (
    copy_doc,
    copy_table,
    restore_doc,
    restore_table,
    verify_doc,
    verify_table,
)

__all__ = [
    "COMMANDS_WITH_SCHEMAS",
    "FOREIGN_SHOWN",
    "FULL",
    "INCREMENTAL",
    "REQUEST_KINDS",
    "SHOW_ENTRIES_LIMIT",
    "SHOW_ROWS_LIMIT",
    "artifacts_text",
    "copy_doc",
    "copy_table",
    "cost_doc",
    "delete_doc",
    "delete_text",
    "directory_summaries",
    "gc_doc",
    "gc_table",
    "id_table",
    "id_texts",
    "json_schema",
    "kind",
    "list_doc",
    "list_table",
    "manifest_doc",
    "operator_summaries",
    "requests_text",
    "restore_doc",
    "restore_table",
    "show_doc",
    "show_lists_entries",
    "show_table",
    "signature_text",
    "verify_doc",
    "verify_table",
]
