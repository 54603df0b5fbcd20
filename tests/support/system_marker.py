"""Which tests are *system* tests: they start a process, a server or an emulator. tests/conftest.py
marks them `system` at collection, so `pytest -m "not system"` is the inner loop (pure logic, well
under a minute) and new tests are covered without an edit: by the fixtures they use, by the folder
they are in, or, for a module that starts processes in its own body, by the short list below.
`-p tests.support.system_audit` fails an unmarked test that starts a process or listens anyway."""
from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import pytest

# Fixtures that start a process, a server or an emulator (a test using one through another fixture
# counts too: pytest's closure of fixture names). `short_dir` exists for the hub's Unix socket.
SYSTEM_FIXTURES = frozenset({
    "kube", "kube_factory", "pai", "pai_factory", "pai_shared", "aml", "aml_factory", "aml_shared", "aml_in_shared", "dlts", "dlts_factory", "dlc",
    "dlts_shared", "dlts_in_shared", "dlc_factory", "dlc_shared", "dlc_in_shared", "slurm", "login_node", "plain_sshd",
    "netns_hosts", "password_user", "ssh_keys",
    "azurite", "azurite_oauth", "bind_mount", "nfs_server", "mounted_on_hosts", "browser", "artifacts",
    "relayed_platform", "small_disk", "short_dir", "stock_python", "bare_python", "nni_image_bin",
    "listener", "server", "job_platform", "kube_shared", "kube_ns", "kube_crd_shared", "kube_crd_ns",
    "kube_v2_shared", "kube_v2", "k8s", "other_user",
})

# Folders whose tests drive real agents, sshd, Slurm, chaos or a browser.
SYSTEM_DIRS = ("agent", "chaos", "remote", "slurm", "webui")

# Modules (or module::test names) that start a process or a server in the test's own body.
SYSTEM_TESTS = (
    "docs/test_config_reference.py", "docs/test_docs_site.py", "docs/test_usage_snippets.py",
    "docs/test_platform_configs.py::test_platform_page_config_passes_dry_run_as_pasted",
    "experiment/test_cli_reopen.py", "experiment/test_list_status.py", "experiment/test_logs_follow.py",
    "experiment/test_nnictl_view.py", "experiment/test_one_manager.py", "experiment/test_python_api.py",
    "experiment/test_summary_hint.py",
    "experiment/test_startup_corpus.py::test_broken_config_is_one_line_and_agrees_across_modes",
    "experiment/test_startup_corpus.py::test_slurm_without_its_controller_is_one_line",
    "kube/test_proxy.py::test_a_socks_proxy_is_refused_in_one_line",
    "optuna/test_optuna_local.py::test_resume_asks_for_a_storage_url_with_a_password_again",
    "security/test_blobfuse_cache.py", "security/test_detach_log.py", "security/test_preauth_flood.py",
    "security/test_relay_flood.py",
    "security/test_secret_values.py::test_what_is_submitted_holds_no_secret_by_value",
    "security/test_shipped_code.py::test_slurm_agent_deps_planted_by_another_user_never_run",
    "experiment/test_annotations.py::test_a_run_expands_a_copy_and_the_trials_get_the_annotated_values",
    "experiment/test_annotations.py::test_experiments_kept_inside_the_code_folder_are_not_copied",
    "experiment/test_annotations.py::test_function_choice_and_scopes_expand_to_runnable_code",
    "experiment/test_annotations.py::test_loading_needs_no_nni_on_the_manager",
    "experiment/test_annotations.py::test_the_cli_runs_it_and_dry_run_writes_nothing",
    "experiment/test_cli.py", "experiment/test_cli_ids.py", "experiment/test_experiment.py",
    "experiment/test_nni_dispatcher.py",
    "manager/test_hub_enrolment.py", "manager/test_hub_tls.py",
    "security/test_agent_env_secrets.py", "security/test_bad_input.py", "security/test_dispatcher_channel.py",
    "security/test_enrolment.py", "security/test_hub_auth.py", "security/test_hub_bounds.py",
    "security/test_metric_ingest.py", "security/test_rest_server.py", "security/test_trial_channel_ids.py",
    "security/test_shell_values.py::test_agent_env_values_reach_the_batch_script_quoted",
    "security/test_shell_values.py::test_python_path_in_the_probe_runs_nothing",
    "security/test_shell_values.py::test_the_agent_s_private_directory_is_made_in_the_job_s_tmpdir_when_usable",
    "storage/test_mounts.py", "storage/test_storage_experiment.py",
    "test_agent_min_python.py", "test_boot.py", "test_dependency_range.py", "test_fork_server.py", "test_fresh_clone.py",
    "test_parallel.py::test_a_crashed_worker_fails_its_test_and_the_run_still_ends",
    "test_proto_current.py", "test_quickstart_serving.py",
    "test_system_marker.py::test_every_test_using_a_process_fixture_is_marked_system",
    "test_system_marker.py::test_the_audit_fails_an_unmarked_test_that_starts_a_process",
    "test_system_marker.py::test_the_inner_loop_starts_no_process",
)


def is_system(nodeid: str, fixturenames: list[str] | tuple[str, ...]) -> bool:
    """`nodeid` as pytest writes it from the repository root (tests/...)."""
    if SYSTEM_FIXTURES.intersection(fixturenames):
        return True
    path = nodeid.removeprefix("tests/")
    if path.split("/", 1)[0] in SYSTEM_DIRS:
        return True
    base = path.split("[", 1)[0]
    return any(base == t or base.startswith(t + "::") for t in SYSTEM_TESTS)


def mark_system(items: list[pytest.Item]) -> None:
    for item in items:
        if is_system(item.nodeid, getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.system)


REPORT_ENV = "NNI_TESTS_MARKER_REPORT"
_DESELECTED = pytest.StashKey[bool]()


def note_deselected(items: list[pytest.Item]) -> None:
    """tests/conftest.py's pytest_deselected: a session that dropped tests (-k, -m, --deselect, --lf)
    no longer holds the whole suite."""
    if items:
        items[0].config.stash[_DESELECTED] = True


class MarkerInfo(TypedDict):
    fixtures: list[str]
    system: bool


def marker_report(items: list[pytest.Item]) -> dict[str, MarkerInfo]:
    """Every test's fixture closure and whether it is marked `system`."""
    return {item.nodeid: {"fixtures": sorted(getattr(item, "fixturenames", ())),
                          "system": item.get_closest_marker("system") is not None} for item in items}


def holds_the_whole_suite(session: pytest.Session, tests_dir: Path) -> bool:
    """Whether this session collected every test under `tests_dir` and kept them all, so that its own
    items are what `pytest --collect-only tests` run from the repository root would list (the full
    suite, as scripts/test.sh runs it; an xdist worker collects them all too)."""
    config = session.config
    if config.stash.get(_DESELECTED, False) or config.option.continue_on_collection_errors:
        return False
    if any(config.getoption(name, None) for name in ("ignore", "ignore_glob", "deselect")):
        return False
    where = config.invocation_params.dir  # run from the repository root (some parameters name files from there)
    return where.resolve() == tests_dir.resolve().parent and config.args in (["tests"], [str(tests_dir)])


def pytest_collection_finish(session: pytest.Session) -> None:
    """With `-p tests.support.system_marker` and $NNI_TESTS_MARKER_REPORT: every collected test's
    fixture closure and whether it is marked `system`, as JSON (tests/test_system_marker.py)."""
    import json
    import os

    path = os.environ.get(REPORT_ENV)
    if path:
        with open(path, "w") as f:
            json.dump(marker_report(session.items), f)
