"""Write docs/reference/config.md from the config parser itself (`--check`: fail if it is stale).

The schema is the code: `nni_manager.loader` and each backend's `parse_options` read every field
through `ConfigSection`'s typed readers (`str_`, `int_`, `duration`, ...). This script parses one
sample config per platform (and variants for optional sub-sections) with those readers recorded,
which gives every field's YAML name, other accepted names, type and where it is read. A field's
default is found by parsing the sample without it and with a probe value: the attribute of the
parsed config that changes is the field's, and its value without the field is the default.
A platform without a sample here makes this script fail, so new backends are never left out.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "reference" / "config.md"
sys.path[:0] = [str(ROOT / "manager"), str(ROOT / "agent")]

from nni_manager import config as cfg  # noqa: E402
from nni_manager.backends import registry  # noqa: E402
from nni_manager.loader import load_config  # noqa: E402

# Parsing looks the platform up among the installed packages' entry points (a scan of every
# distribution, ~0.1 s); this script parses ~2,500 configs and installs nothing meanwhile: one scan.
registry._entry_points = functools.cache(registry._entry_points)  # type: ignore[method-assign]

READERS = ("str_", "int_", "bool_", "duration", "path_", "gpu_indices", "section", "items", "choice", "number",
           "mapping", "take")
ROOT_FIELDS = {"trialCommand": "python3 trial.py", "trialConcurrency": 1, "trialGpuNumber": 0,
               "nniManagerIp": "10.0.0.5", "debug": False}  # not dialed: a sample the parser reads
ROLE = {"replicas": 1, "command": "python3 train.py"}
# One sample `trainingService` per platform (a list: variants that open optional sub-sections).
SAMPLES: dict[str, list[dict[str, Any]]] = {
    "local": [{}],
    "remote": [{"machineList": [{"host": "gpu-box-1", "user": "alice"}]}],
    "kubernetes": [{"storage": {"storageType": "nfs", "server": "nfs.example", "path": "/x"}},
                   {"storage": {"storageType": "pvc", "claimName": "outputs"}}],
    "kubeflow": [{"operator": "tf-operator", "apiVersion": "v1", "worker": ROLE, "ps": ROLE},
                 {"operator": "pytorch-operator", "apiVersion": "v1", "master": ROLE, "worker": ROLE},
                 {"operator": "trainer", "trainingRuntime": "torch-distributed", "worker": ROLE}],
    "frameworkcontroller": [{"taskRoles": [{"name": "worker", "taskNumber": 1, "command": "python3 train.py",
                                            "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1,
                                                                                 "minSucceedTaskCount": 1}}]}],
    "slurm": [{}, {"loginNode": {"host": "login.example", "user": "alice"}}],
    "openpai": [{"host": "pai.example", "username": "alice", "token": "t0ken", "trialMemorySize": "8gb"}],
    "dlts": [{"dashboard": "http://dlts.example/", "email": "a@example", "password": "pw", "team": "t",
              "image": "my/image"}],
    "aml": [{"subscriptionId": "s", "resourceGroup": "g", "workspaceName": "w", "computeTarget": "c"}],
    "dlc": [{"image": "my/image", "podCount": 1, "ecsSpec": "ecs.c6.large", "region": "cn-hangzhou",
             "workspaceId": "ws", "nasDataSourceId": "d", "accessKeyId": "ak", "accessKeySecret": "sk",
             "localStorageMountPoint": "/home/admin/workspace/", "containerStorageMountPoint": "/root/data/"}],
    "adl": [{"image": "my/image", "checkpoint": {"storageClass": "standard", "storageSize": "1Gi"},
             "nfs": {"server": "nfs.example", "path": "/x", "containerMountPath": "/data"}}],
}
TYPES = {"str_": "string", "path_": "path", "bool_": "boolean", "gpu_indices": "list of GPU indices",
         "mapping": "mapping", "items": "list of mappings", "section": "mapping",
         "duration": "duration (seconds, or 30s / 5m / 2h / 1d)", "take": "value (checked by the parser)"}
# Fields the parser reads raw (`take`) and checks itself: what they hold, where it is not obvious.
RAW_TYPES = {"trainingService": "mapping, or a list of them (hybrid mode)", "searchSpace": "mapping",
             "agentEnv": "mapping of variable names to values", "storage": "mapping (v1: `nfs`, with an `nfs` section)",
             "memorySize": "size (MB as a number, or 8gb / 8192mb / 8Gi)",
             "trialMemorySize": "size (MB as a number, or 8gb / 8192mb / 8Gi)",
             "timeLimit": "minutes, Slurm's format or a duration", "sbatchOptions": "string or list of strings",
             "prologue": "string or list of strings", "openpaiConfig": "mapping (OpenPAI job protocol v2)",
             "token": "string", "passWord": "refused: use `token`",
             "sharedStorage": "mapping (NFS or AzureBlob: [Shared storage](../platforms/shared-storage.md))"}
# Top-level sections read with every platform, one variant each (sharedStorage: NFS, then AzureBlob)
ROOT_VARIANTS: list[dict[str, Any]] = [
    {"sharedStorage": {"storageType": "NFS", "localMountPoint": "/mnt/nni", "remoteMountPoint": "/mnt/nni",
                       "nfsServer": "nfs.example", "exportedDirectory": "/export", "localMounted": "nnimount"}},
    {"sharedStorage": {"storageType": "AzureBlob", "localMountPoint": "/mnt/nni", "remoteMountPoint": "/mnt/nni",
                       "storageAccountName": "acct", "storageAccountKey": "k3y", "containerName": "nni",
                       "localMounted": "nnimount"}},
]


IGNORED = object()  # a field the parser accepts and that changes nothing


@dataclasses.dataclass
class Read:
    path: str  # where the field sits, list indices as []: "trainingService.machineList[]"
    name: str
    aliases: tuple[str, ...]
    reader: str
    kwargs: dict[str, Any]

    @property
    def key(self) -> str:
        return f"{self.path}.{self.name}" if self.path else self.name


@contextlib.contextmanager
def recording() -> Iterator[list[Read]]:
    """Record the outermost typed read of every field (path_ calls str_ calls take: one read)."""
    reads: list[Read] = []
    depth = [0]
    originals = {name: getattr(cfg.ConfigSection, name) for name in READERS}

    def wrap(name: str, original: Any) -> Any:
        def reader(self: cfg.ConfigSection, field: str = "gpuIndices", *aliases: str, **kwargs: Any) -> Any:
            if depth[0] == 0:
                reads.append(Read(re.sub(r"\[\d+\]", "[]", self.path), field, aliases, name, kwargs))
            depth[0] += 1
            try:
                return original(self, field, *aliases, **kwargs)
            finally:
                depth[0] -= 1
        return reader

    for name, original in originals.items():
        setattr(cfg.ConfigSection, name, wrap(name, original))
    try:
        yield reads
    finally:
        for name, original in originals.items():
            setattr(cfg.ConfigSection, name, original)


def full_config(platform: str, ts: dict[str, Any], code_dir: Path) -> dict[str, Any]:
    return {**ROOT_FIELDS, "trialCodeDirectory": str(code_dir), "trainingService": {"platform": platform, **ts}}


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            out |= flatten(getattr(value, f.name), f"{prefix}.{f.name}" if prefix else f.name)
        return out
    if isinstance(value, list) and value and all(dataclasses.is_dataclass(v) for v in value):
        out = {}
        for i, v in enumerate(value):
            out |= flatten(v, f"{prefix}[{i}]")
        return out
    return {prefix: value}


def remove(holder: dict[str, Any], read: Read) -> None:
    """Drop the field under every name the parser takes for it (NNI's key rule)."""
    names = {cfg.canonical_key(n) for n in (read.name, *read.aliases)}
    for key in [k for k in holder if cfg.canonical_key(k) in names]:
        del holder[key]


def snake(name: str) -> str:
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


def locate(data: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The mapping at a recorded path (list entries: the first), or None."""
    node: Any = data
    for part in [p for p in path.split(".") if p]:
        name, is_list = part.removesuffix("[]"), part.endswith("[]")
        if not isinstance(node, dict) or name not in node:
            return None
        node = node[name][0] if is_list else node[name]
    return node if isinstance(node, dict) else None


def probes(read: Read, scratch: Path) -> list[Any]:
    options = read.kwargs.get("options")
    if options:
        return list(options)
    minimum = read.kwargs.get("minimum", 0)
    return {
        "str_": ["probe-value", "https://probe.example"], "path_": [str(scratch / "dir"), str(scratch / "file")], "bool_": [True, False],
        "int_": [max(minimum, 0) + 3], "number": [max(minimum, 0) + 3], "duration": [7],
        "gpu_indices": [[3]], "mapping": [{"PROBE": "x"}],
        "take": ["probe-value", 3, "3gb", ["--probe"], True],
    }.get(read.reader, [])


def parse(data: dict[str, Any], base: Path) -> dict[str, Any] | None:
    try:
        return flatten(load_config(copy.deepcopy(data), base_dir=base))
    except cfg.ConfigError:
        return None


def default_of(read: Read, data: dict[str, Any], scratch: Path) -> Any:
    """The value the parsed config holds without the field, at the attribute the field sets."""
    if read.kwargs.get("required"):
        return "required"
    if read.reader in ("section", "items"):
        return ""
    holder = locate(data, read.path)
    if holder is None:
        return ""
    without = copy.deepcopy(data)
    remove(locate(without, read.path), read)  # type: ignore[arg-type]
    baseline = parse(without, scratch)
    if baseline is None:
        return "required"
    accepted = True  # every probe value taken, and none changed anything
    for probe in probes(read, scratch):
        with_it = copy.deepcopy(without)
        locate(with_it, read.path)[read.name] = probe  # type: ignore[index]
        changed = parse(with_it, scratch)
        if changed is None:
            accepted = False
            continue
        moved = sorted((k for k in baseline if changed.get(k) != baseline[k]), key=lambda k: k.count("."))
        if moved:  # the shallowest: trialGpuNumber sets trial_gpu_number (and a backend's copy of it)
            return baseline[moved[0]]
    named = sorted((k for k in baseline if re.split(r"[.\]]", k)[-1] == snake(read.name)), key=lambda k: k.count("."))
    if named:  # no probe passed: the attribute of the same name
        return baseline[named[0]]
    return IGNORED if accepted else ""


def shown(value: Any, scratch: Path) -> str:
    if value is IGNORED:
        return "accepted, ignored"
    if value == "":
        return ""
    if value in ("required",):
        return "**required**"
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        value = f"{value:g}"
    text = str(value).replace(str(scratch), "<config folder>").replace(str(Path.home()), "~")
    return f"`{text}`"


def type_of(read: Read) -> str:
    minimum = read.kwargs.get("minimum", 0)
    if read.reader == "int_":
        return f"integer >= {minimum}"
    if read.reader == "number":
        return f"number >= {minimum:g}"
    if read.reader == "choice":
        return "one of " + ", ".join(f"`{o}`" for o in read.kwargs["options"])
    if read.reader == "take":
        return RAW_TYPES.get(read.name, TYPES["take"])
    return TYPES[read.reader]


def collect(scratch: Path) -> dict[str, dict[str, Any]]:
    """field key -> {read, platforms, defaults: {platform: shown default}} in first-read order."""
    missing = sorted(set(registry.platforms()) - set(SAMPLES))
    if missing:
        raise SystemExit(f"no sample config for platform(s) {', '.join(missing)}: add them to SAMPLES in {__file__}")
    fields: dict[str, dict[str, Any]] = {}
    for platform, variants in SAMPLES.items():
        window = registry.backend_class(platform).default_reconnect_window
        for ts, extra in [(ts, {}) for ts in variants] + [(variants[0], r) for r in ROOT_VARIANTS]:
            data = full_config(platform, ts, scratch) | copy.deepcopy(extra)
            with recording() as reads:
                load_config(copy.deepcopy(data), base_dir=scratch)
            for read in reads:
                entry = fields.setdefault(read.key, {"read": read, "platforms": set(), "defaults": {}, "also": []})
                if entry["read"].reader == "take" and read.reader != "take":  # the typed read says more
                    aliases = tuple(dict.fromkeys(entry["read"].aliases + read.aliases))
                    entry["read"] = dataclasses.replace(read, aliases=aliases)
                entry["platforms"].add(platform)
                if platform not in entry["defaults"]:
                    default = default_of(read, data, scratch)
                    if read.key == "trainingService.reconnectWindow" and default is None:
                        default = window  # the backend's own default (Backend.default_reconnect_window)
                    duration = read.reader == "duration" and isinstance(default, float)
                    entry["defaults"][platform] = shown(default, scratch) + (" s" if duration else "")
    return merge_shortcuts(fields)


def merge_shortcuts(fields: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A field NNI accepts both at the top level and in `trainingService` is one row, where it is typed."""
    for name in [k for k in fields if "." not in k]:
        inner = f"trainingService.{name}"
        if inner not in fields or name not in fields:
            continue
        outer_raw, inner_raw = fields[name]["read"].reader == "take", fields[inner]["read"].reader == "take"
        if outer_raw and not inner_raw:
            fields[inner]["also"].append("top level")
            fields[inner]["read"] = dataclasses.replace(
                fields[inner]["read"], aliases=tuple(dict.fromkeys(fields[inner]["read"].aliases
                                                                   + fields[name]["read"].aliases)))
            del fields[name]
        elif inner_raw and not outer_raw:
            fields[name]["also"].append("in `trainingService`")
            del fields[inner]
    return fields


SECTION_TITLES = {"": "Experiment (top level)", "trainingService": "trainingService"}


def render(fields: dict[str, dict[str, Any]]) -> str:
    every = set(SAMPLES)
    lines = [
        "# Config reference",
        "",
        "<!-- Generated by scripts/gen_config_reference.py from the config parser; do not edit by hand. -->",
        "",
        "Every field `nni-manager` reads from an experiment config, as the parser reads it. Keys are case- and",
        "underscore-insensitive (NNI's rule: `trial_command` is `trialCommand`). *Also accepted* lists other names",
        "of the same field (NNI v1 spellings among them); NNI v1's platform sections (`paiConfig`, `kubeflowConfig`,",
        "`frameworkcontrollerConfig`, `dltsConfig`, `amlConfig`, `remoteConfig`, `localConfig`) and `trial`",
        "are merged into `trainingService` first. A default that differs by platform is given per platform;",
        "*(none)* means unset (the platform decides, see its page). Unknown fields are refused, naming the",
        "closest known one. Hybrid mode (`trainingService` as a list, or v1's `hybridConfig.trainingServicePlatforms`):",
        "each entry takes its own platform's `trainingService` fields, see [Hybrid mode](../platforms/hybrid.md).",
        "",
        "Platforms: " + ", ".join(f"`{p}`" for p in sorted(every)) + ". How each field is used: the",
        "[platform pages](../platforms/index.md).",
        "",
    ]
    sections: dict[str, list[dict[str, Any]]] = {}
    for entry in fields.values():
        sections.setdefault(entry["read"].path, []).append(entry)
    for path, entries in sections.items():
        lines += [f"## {SECTION_TITLES.get(path, '`' + path + '`')}", "",
                  "| field | also accepted | type | default | platforms |", "|---|---|---|---|---|"]
        for entry in entries:
            read: Read = entry["read"]
            platforms = "all" if entry["platforms"] == every else ", ".join(sorted(entry["platforms"]))
            defaults = entry["defaults"]
            if len(set(defaults.values())) <= 1:
                default = next(iter(defaults.values()), "")
            else:
                default = "; ".join(f"{p}: {d or '(none)'}" for p, d in sorted(defaults.items()))
            also = ", ".join([f"`{a}`" for a in read.aliases] + entry["also"])
            lines.append(f"| `{read.name}` | {also} | {type_of(read)} | {default} | {platforms} |")
        lines.append("")
    return "\n".join(lines)


def generate() -> str:
    for name in ("DLWS_USER_EMAIL", "DLTS_JOB_TOKEN", "DLWS_VC_NAME", "KUBECONFIG"):
        os.environ.pop(name, None)  # DLTS reads these as defaults: the page must not depend on them
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp).resolve()
        (scratch / "file").write_text("probe\n")
        (scratch / "dir").mkdir()
        return render(collect(scratch))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed page differs")
    args = parser.parse_args()
    text = generate()
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run python scripts/gen_config_reference.py", file=sys.stderr)
            return 1
        print(f"{OUT.relative_to(ROOT)} is current")
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
