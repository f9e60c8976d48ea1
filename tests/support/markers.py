"""Which tests carry which markers, decided at collection.

``tests/conftest.py`` applies these rules to every collected test (:func:`markers_of`),
so that test modules need not say it themselves:

* ``servers``: the test uses a server fixture (:data:`SERVER_FIXTURES`, directly or
  through another fixture), or is parametrized with a remote backend (any parameter
  whose value is in :data:`REMOTE_BACKENDS`: ``backend``, or a module's own), or is one
  of :data:`STARTS_A_SERVER`, which start an emulator themselves. What the rules miss
  cannot pass unnoticed: while a test not marked ``servers`` runs, an emulator's start
  raises (:func:`support.servers.refusing_starts`).
* ``slow``: the test is one of :data:`SLOW_TESTS`, long tests in modules that are
  otherwise quick (a module that is slow as a whole says so in its own ``pytestmark``,
  with ``subprocess`` where it is built on spawned processes).
* ``subprocess`` and ``torch``: by directory (:data:`DIRECTORY_MARKERS`): the
  command-line tests run ``cairn`` as real subprocesses; the DCP tests need torch.

Every name in these tables is a test defined in its file (``tests/project/test_markers.py``
checks it), so a renamed test cannot drop out of a table silently.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .backends import BACKENDS
from .paths import REPO

SERVER_FIXTURES = frozenset({"s3_server", "azurite_server", "gcs_server"})
"""The session fixtures that start a server; every other server fixture requests one."""

REMOTE_BACKENDS = frozenset(BACKENDS) - {"memory", "local"}
"""Parameter values that make a test open a store on a server (see ``make_store``)."""

STARTS_A_SERVER = frozenset(
    {
        "tests/stores/test_support_servers.py::test_s3_server_lifecycle_and_reset",
        "tests/stores/test_support_gcs_proxy.py::test_a_binary_this_os_cannot_run_is_unavailable",
    }
)
"""Tests that start an emulator themselves, without a fixture."""

SLOW_TESTS = frozenset(
    {
        "tests/cli/test_cli.py::test_list_show_verify_restore_on_a_local_store",
        "tests/cli/test_cli.py::test_the_process_exits_cleanly_every_time",
        "tests/cli/test_cli_help.py::test_descriptions_have_no_stray_line_breaks_and_exit_codes_are_listed",
        "tests/cli/test_cli_help.py::test_help_shows_flags_and_arguments_plainly",
        "tests/cli/test_cli_json.py::test_every_command_document_matches_its_schema",
        "tests/cli/test_cli_json.py::test_every_failure_prints_one_json_object",
        "tests/cli/test_cli_signing.py::test_a_forged_latest_is_refused_and_copy_signs_with_the_key",
        "tests/cli/test_cli_signing.py::test_verify_and_show_say_what_is_signed_and_check_it_with_the_key",
        "tests/cli/test_copy_after_gc.py::test_copy_and_restore_keep_compressed_artifacts_as_stored",
        "tests/dcp/test_export_hf.py::test_export_and_import_on_the_command_line",
        "tests/dcp/test_torch_dcpdir.py::test_export_and_import_on_the_command_line",
        "tests/dcp/test_torch_dcpdir.py::test_the_commands_fail_with_their_exit_codes",
        "tests/format/test_old_layout.py::test_the_command_line_lists_verifies_copies_and_restores_unpacked_checkpoints",
        "tests/project/test_doc_pages.py::test_every_guide_works_from_start_to_end",
        "tests/project/test_readme.py::test_every_cairn_command_of_the_readme_runs",
        "tests/protocol/test_damaged_records.py::test_show_summarises_a_checkpoint_of_20000_partitions",
        "tests/protocol/test_lost_replies.py::test_lost_replies_when_retries_run_out",
        "tests/protocol/test_lost_replies.py::test_lost_replies_with_retries_to_spare",
        "tests/stores/test_budget.py::test_the_server_never_sees_more_than_the_limit_while_it_throttles",
    }
)
"""Tests of a few seconds or more each (``pytest --durations``), in quick modules."""


DIRECTORY_MARKERS = {
    "tests/cli": ("subprocess",),
    "tests/dcp": ("torch",),
}
"""The markers of every test under a directory."""


def node_name(item: pytest.Item) -> str:
    """``path::function`` (or ``path::Class::function``): the node id without parameters."""
    return item.nodeid.split("[", 1)[0]


def needs_a_server(item: pytest.Item) -> bool:
    """Whether ``item`` starts, or uses, moto, Azurite or fake-gcs-server."""
    if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    params: dict[str, Any] = callspec.params if callspec is not None else {}
    if any(isinstance(value, str) and value in REMOTE_BACKENDS for value in params.values()):
        return True
    return node_name(item) in STARTS_A_SERVER


def is_slow(item: pytest.Item) -> bool:
    """Whether ``item`` is one of the long tests of :data:`SLOW_TESTS`."""
    return node_name(item) in SLOW_TESTS


def markers_of(item: pytest.Item) -> Iterator[str]:
    """The names of the markers these rules give ``item``."""
    if needs_a_server(item):
        yield "servers"
    if is_slow(item):
        yield "slow"
    for directory, names in DIRECTORY_MARKERS.items():
        if item.path.is_relative_to(REPO / directory):
            yield from names
