"""Hardware, fabric and model catalogs, and the published reference datasets (pure: no torch).

One source of truth: the YAML files in ``data/`` (the repository's ``data`` folder, or the folder
named by ``$LABKIT_DATA``). Every number there carries its source in the entry's ``sources``
mapping; loading validates each entry (a missing field, a negative number, a number without a
source) and names the file, the entry and the field in a :class:`~labkit.errors.UsageError`.

- ``data/accelerators.yaml``: peak dense FLOP/s by precision, memory, memory bandwidth.
- ``data/fabrics.yaml``: bandwidth per direction per GPU and latency of each link, and its
  ``scope``: ``intra`` (GPUs of one node) or ``inter`` (between nodes).
- ``data/nodes.yaml``: GPUs per node, which accelerator, which fabric inside and between nodes.
- ``data/models.yaml``: parameter counts and transformer shapes; a mixture of experts also
  gives ``active_params`` (per token), ``num_experts`` and ``experts_per_token``.
- ``data/local.yaml``: a reference 2-core VM measured on 2026-11-21 (another machine, not the
  one the lab runs on: a prediction on this machine uses this run's profile, :mod:`labkit.machine`);
  it also appears as accelerator ``local`` and fabric ``local`` (scope ``any``).
- ``data/reference/*.yaml``: published timings, loaded by :func:`load_reference`; published
  runs beside the model: :mod:`labkit.perfmodel.published`.

>>> sorted(load_catalog("fabrics"))[:4]
['100GbE', 'IB_EDR_DGX1', 'IB_HDR', 'IB_NDR']
>>> load_reference("ddp_k80").time_s.tolist()
[226.0, 134.0, 95.0, 76.0]
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from labkit.errors import UsageError

CATALOGS = ("accelerators", "fabrics", "nodes", "models", "local")


def data_dir() -> Path:
    """The catalog folder: ``$LABKIT_DATA`` if set, else ``data/`` beside the package."""
    env = os.environ.get("LABKIT_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "data"


# --- the entries --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Accelerator:
    key: str
    name: str
    memory_gb: float
    memory_bandwidth_gb_per_s: float
    peak_flops: dict = field(default_factory=dict)  # precision -> dense FLOP/s
    sources: dict = field(default_factory=dict)

    def peak(self, precision: str) -> float:
        """Peak dense FLOP/s at ``precision``; an unlisted precision is an error naming the list."""
        if precision not in self.peak_flops:
            raise UsageError(f"accelerator {self.key!r} has no peak for precision {precision!r}; "
                             f"listed: {', '.join(self.peak_flops)}")
        return float(self.peak_flops[precision])


SCOPES = ("intra", "inter", "any")


@dataclass(frozen=True)
class Fabric:
    key: str
    name: str
    bandwidth_gb_per_s: float  # per direction, per GPU (what one rank can push into a ring)
    latency_us: float
    sources: dict = field(default_factory=dict)
    scope: str = "inter"  # intra: GPUs of one node; inter: between nodes; any: both (local)

    @property
    def beta_bytes_per_s(self) -> float:
        return self.bandwidth_gb_per_s * 1e9

    @property
    def alpha_s(self) -> float:
        return self.latency_us * 1e-6


@dataclass(frozen=True)
class Node:
    key: str
    name: str
    accelerator: str
    gpus_per_node: int
    cpu_cores: int
    intra_fabric: str
    inter_fabric: str
    sources: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ModelSpec:
    key: str
    name: str
    params: float
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_len: int
    sources: dict = field(default_factory=dict)
    active_params: float | None = None  # a mixture of experts: parameters used per token
    num_experts: int = 1
    experts_per_token: int = 1

    @property
    def flop_params(self) -> float:
        """Parameters one token passes through (all of them, or a mixture's active ones)."""
        return self.active_params or self.params

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1


_SCHEMA: dict[str, tuple[type, dict[str, str]]] = {
    # field -> kind: "str", "num" (> 0, needs a source), "int" (>= 1, needs a source), "flops" (dict)
    "accelerators": (Accelerator, {"name": "str", "memory_gb": "num",
                                   "memory_bandwidth_gb_per_s": "num", "peak_flops": "flops"}),
    "fabrics": (Fabric, {"name": "str", "bandwidth_gb_per_s": "num", "latency_us": "num",
                         "scope": "str"}),
    "nodes": (Node, {"name": "str", "accelerator": "str", "gpus_per_node": "int", "cpu_cores": "int",
                     "intra_fabric": "str", "inter_fabric": "str"}),
    "models": (ModelSpec, {"name": "str", "params": "num", "num_layers": "int", "hidden_size": "int",
                           "num_heads": "int", "ffn_hidden_size": "int", "vocab_size": "int",
                           "seq_len": "int", "active_params": "num?", "num_experts": "int?",
                           "experts_per_token": "int?"}),
}
LOCAL_FIELDS = {"name": "str", "alpha_s": "num", "beta_bytes_per_s": "num",
                "compute_flop_per_s": "num", "memory_gb": "num", "world_size": "int",
                "measured": "str", "dp_overlap_fraction": "fraction?",
                "dp_overlap_measured": "str?"}


def _check_number(where: str, name: str, value: Any, kind: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UsageError(f"{where}: field {name!r} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{where}: field {name!r} must be a non-negative number, got {value!r}")
    if kind == "int" and (int(value) != value or value < 1):
        raise UsageError(f"{where}: field {name!r} must be an integer >= 1, got {value!r}")
    if kind == "num" and value == 0:
        raise UsageError(f"{where}: field {name!r} must be positive, got 0")
    return int(value) if kind == "int" else float(value)


def validate_entry(where: str, entry: Any, schema: dict[str, str]) -> dict:
    """Check one catalog entry against ``schema``; return its fields converted.

    Every number needs a source: ``sources[field]`` (or ``sources["*"]`` for the whole entry).
    A kind ending in ``?`` is optional; ``fraction`` is a number in [0, 1].

    >>> validate_entry("f.yaml: entry 'x'", {"name": "x", "latency_us": -1, "sources": {"*": "s"}},
    ...                {"name": "str", "latency_us": "num"})
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: f.yaml: entry 'x': field 'latency_us' must be a non-negative number, got -1
    """
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: must be a mapping of fields, got {type(entry).__name__}")
    sources = entry.get("sources") or {}
    if not isinstance(sources, dict):
        raise UsageError(f"{where}: field 'sources' must be a mapping field -> source")
    out: dict[str, Any] = {}
    for name, kind in schema.items():
        optional = kind.endswith("?")
        kind = kind.rstrip("?")
        if name not in entry or entry[name] is None:
            if optional:
                continue
            raise UsageError(f"{where}: missing field {name!r}")
        value = entry[name]
        if kind == "str":
            if not isinstance(value, str) or not value.strip():
                raise UsageError(f"{where}: field {name!r} must be a non-empty string")
            out[name] = value
            continue
        if name not in sources and "*" not in sources:
            raise UsageError(f"{where}: field {name!r} has no source (add sources.{name})")
        if kind == "flops":
            if not isinstance(value, dict) or not value:
                raise UsageError(f"{where}: field {name!r} must map precision -> FLOP/s")
            out[name] = {str(p): _check_number(where, f"{name}.{p}", v, "num")
                         for p, v in value.items()}
        elif kind == "fraction":
            out[name] = _check_number(where, name, value, "any")
            if out[name] > 1:
                raise UsageError(f"{where}: field {name!r} must be in [0, 1], got {value!r}")
        else:
            out[name] = _check_number(where, name, value, kind)
    out["sources"] = dict(sources)
    return out


def _read_yaml(path: Path) -> Any:
    import yaml

    if not path.is_file():
        raise UsageError(f"{path}: catalog file not found")
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise UsageError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None


@lru_cache(maxsize=32)
def _load(name: str, folder: str) -> dict:
    path = Path(folder) / f"{name}.yaml"
    raw = _read_yaml(path)
    if not isinstance(raw, dict) or not raw:
        raise UsageError(f"{path}: must be a non-empty mapping of entries")
    out = {}
    for key, entry in raw.items():
        where = f"{path.name}: entry {key!r}"
        if name == "local":
            out[str(key)] = validate_entry(where, entry, LOCAL_FIELDS)
            continue
        cls, schema = _SCHEMA[name]
        fields = validate_entry(where, entry, schema)
        if name == "fabrics" and fields["scope"] not in SCOPES[:2]:
            raise UsageError(f"{where}: field 'scope' must be intra or inter, got {fields['scope']!r}")
        if name == "models" and fields.get("active_params", 0) > fields["params"]:
            raise UsageError(f"{where}: field 'active_params' exceeds 'params'")
        out[str(key)] = cls(key=str(key), **fields)
    return out


def load_catalog(name: str, folder: str | os.PathLike | None = None) -> dict:
    """All entries of catalog ``name`` (one of :data:`CATALOGS`), validated, keyed by entry name.

    Accelerators and fabrics include ``local`` (built from ``local.yaml``)."""
    if name not in CATALOGS:
        raise UsageError(f"unknown catalog {name!r}; known: {', '.join(CATALOGS)}")
    folder = str(Path(folder) if folder else data_dir())
    entries = dict(_load(name, folder))
    if name in ("accelerators", "fabrics"):
        loc = _load("local", folder).get("local")
        if loc is not None:
            entries["local"] = _local_as(name, loc)
    if name == "nodes":
        for key, node in entries.items():
            where = f"nodes.yaml: entry {key!r}"
            if node.accelerator not in load_catalog("accelerators", folder):
                raise UsageError(f"{where}: field 'accelerator' names unknown accelerator "
                                 f"{node.accelerator!r}")
            fabs = load_catalog("fabrics", folder)
            for f, scope in (("intra_fabric", "intra"), ("inter_fabric", "inter")):
                if getattr(node, f) not in fabs:
                    raise UsageError(f"{where}: field {f!r} names unknown fabric "
                                     f"{getattr(node, f)!r}")
                if fabs[getattr(node, f)].scope not in (scope, "any"):
                    raise UsageError(f"{where}: field {f!r} names fabric {getattr(node, f)!r} "
                                     f"of scope {fabs[getattr(node, f)].scope!r}")
    return entries


def _local_as(kind: str, loc: dict):
    src = {"*": loc["measured"]}
    if kind == "accelerators":
        return Accelerator("local", loc["name"], loc["memory_gb"],
                           loc.get("memory_bandwidth_gb_per_s", 1.0),
                           {"fp32": loc["compute_flop_per_s"]}, src)
    return Fabric("local", loc["name"], loc["beta_bytes_per_s"] / 1e9, loc["alpha_s"] * 1e6, src,
                  scope="any")


def _lookup(catalog: str, what: str, key: str, folder=None):
    entries = load_catalog(catalog, folder)
    if key not in entries:
        raise UsageError(f"unknown {what} {key!r}; known: {', '.join(sorted(entries))}")
    return entries[key]


def accelerator(key: str, folder=None) -> Accelerator:
    return _lookup("accelerators", "accelerator", key, folder)


def fabric_keys(scope: str | None = None, folder=None) -> list[str]:
    """Fabric keys usable ``scope`` (intra: inside a node, inter: between nodes; None: all).

    >>> fabric_keys("intra")
    ['InfinityFabric_MI300X', 'NVLink2', 'NVLink3', 'NVLink4', 'NVLink5', 'local']
    """
    return sorted(k for k, f in load_catalog("fabrics", folder).items()
                  if scope is None or f.scope in (scope, "any"))


def fabric(key: str, folder=None, *, scope: str | None = None) -> Fabric:
    """A fabric by key; with ``scope`` (intra or inter) it must link GPUs that way, and an
    unknown key lists only the fabrics of that scope.

    >>> fabric("NVLink4", scope="inter")
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: fabric 'NVLink4' links GPUs inside a node, not nodes; inter-node fabrics: 100GbE, IB_EDR_DGX1, IB_HDR, IB_NDR, RoCE_400G, local
    """
    if scope is None:
        return _lookup("fabrics", "fabric", key, folder)
    entries = load_catalog("fabrics", folder)
    where = {"inter": "inter-node", "intra": "intra-node"}[scope]
    valid = ", ".join(fabric_keys(scope, folder))
    if key not in entries:
        raise UsageError(f"unknown fabric {key!r} ({where} expected); {where} fabrics: {valid}")
    f = entries[key]
    if f.scope not in (scope, "any"):
        what = "inside a node, not nodes" if f.scope == "intra" else "between nodes, not inside one"
        raise UsageError(f"fabric {key!r} links GPUs {what}; {where} fabrics: {valid}")
    return f


def node(key: str, folder=None) -> Node:
    return _lookup("nodes", "node", key, folder)


def model_preset(key: str, folder=None) -> ModelSpec:
    return _lookup("models", "model", key, folder)


def local_entry(folder=None) -> dict:
    """The committed ``local`` entry, a reference 2-core VM (alpha_s, beta_bytes_per_s,
    compute_flop_per_s, measured): another machine, never a prediction's input for this one."""
    return dict(_lookup("local", "local entry", "local", folder))


def catalog_frame(name: str, folder=None):
    """A catalog as a DataFrame, one row per entry (``peak_flops`` spread as ``peak_<prec>_flops``)."""
    import dataclasses

    import pandas as pd

    rows = []
    for key, e in load_catalog(name, folder).items():
        d = dataclasses.asdict(e) if dataclasses.is_dataclass(e) else {"key": key, **e}
        d.pop("sources", None)
        for p, v in (d.pop("peak_flops", None) or {}).items():
            d[f"peak_{p}_flops"] = v
        rows.append(d)
    return pd.DataFrame(rows)


# --- reference datasets ---------------------------------------------------------------------------

def reference_names(folder=None) -> list[str]:
    """Names of the published datasets in ``data/reference/`` (``ddp_k80``, ``ddp_v100``, ...)."""
    return sorted(p.stem for p in (Path(folder or data_dir()) / "reference").glob("*.yaml"))


def load_reference(name: str, folder=None):
    """A published dataset as a DataFrame; ``df.attrs`` holds its title, source, url and notes.

    >>> df = load_reference("ddp_v100")
    >>> df[(df.model == "resnet50") & df.ddp].step_time_p50_s.tolist()
    [0.1, 0.103, 0.103, 0.104, 0.104]
    """
    import pandas as pd

    names = reference_names(folder)
    if name not in names:
        raise UsageError(f"unknown reference dataset {name!r}; known: {', '.join(names)}")
    path = Path(folder or data_dir()) / "reference" / f"{name}.yaml"
    raw = _read_yaml(path)
    for key in ("source", "columns", "rows"):
        if key not in (raw or {}):
            raise UsageError(f"{path.name}: missing field {key!r}")
    cols = list(raw["columns"])
    for i, r in enumerate(raw["rows"]):
        if len(r) != len(cols):
            raise UsageError(f"{path.name}: row {i} has {len(r)} values for {len(cols)} columns")
    df = pd.DataFrame(raw["rows"], columns=cols)
    for c in cols:
        if c.endswith("_s"):
            df[c] = df[c].astype(float)
            if (df[c] <= 0).any():
                raise UsageError(f"{path.name}: column {c!r} has a non-positive time")
    df.attrs.update({k: raw.get(k, "") for k in ("name", "title", "source", "url", "notes")})
    return df
