"""What :func:`labkit.perfmodel.model.predict` returns: one layout's predicted step, its memory
verdict and its row for a table (pure: no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit.perfmodel import topology


@dataclass(frozen=True)
class Prediction:
    """One layout's predicted step (seconds per GPU per step, bytes per GPU), in every
    dimension: the EP and CP fields (:mod:`~labkit.perfmodel.ep_cp`) are zero, or empty, at
    CP = EP = 1, so a 3-D layout's prediction and row are the 3-D model's."""

    dp: int
    tp: int
    pp: int
    num_microbatches: int
    schedule: str
    virtual_stages: int
    microbatch_size: float
    compute_s: float
    bubble_s: float
    dp_comm_s: float  # exposed: what the step pays after the overlap with backward
    tp_comm_s: float
    pp_comm_s: float
    step_time_s: float
    bubble_fraction: float
    scaling_efficiency: float
    samples_per_s: float
    tokens_per_s: float
    mfu: float
    memory: dict = field(default_factory=dict)
    memory_capacity_bytes: float = 0.0
    dp_link: str = ""
    world_size: int = 1
    hfu: float = 0.0
    dp_comm_total_s: float = 0.0  # before the overlap
    dp_overlap: float = 0.0
    dp_algorithm: str = ""
    dp_ranks_per_node: int = 1
    dp_nodes: int = 1
    tp_algorithm: str = ""
    tp_link: str = ""
    pp_link: str = ""
    placement: str = topology.MEGATRON
    zero_stage: int = 0
    recompute: str = "none"
    model_flops: float = 0.0
    hardware_flops: float = 0.0
    # beyond 3-D: the K/V ring and the experts' all-to-alls, and where each runs
    cp: int = 1
    ep: int = 1
    cp_comm_s: float = 0.0
    ep_comm_s: float = 0.0
    cp_link: str = ""
    ep_algorithm: str = ""
    ep_link: str = ""
    ep_all_to_all_bytes: float = 0.0

    @property
    def fits(self) -> bool:
        return self.memory["total"] <= self.memory_capacity_bytes

    def verdict(self) -> str:
        """'fits' or the out-of-memory sentence with the breakdown."""
        gb = {k: v / 1e9 for k, v in self.memory.items()}
        if self.fits:
            return f"fits: {gb['total']:.1f} GB of {self.memory_capacity_bytes / 1e9:.0f} GB"
        return (f"out of memory: needs {gb['total']:.1f} GB > "
                f"{self.memory_capacity_bytes / 1e9:.0f} GB (weights {gb['weights']:.1f}, "
                f"gradients {gb['gradients']:.1f}, optimizer {gb['optimizer']:.1f}, "
                f"activations {gb['activations']:.1f})")

    def row(self) -> dict:
        """A flat dict (the memory in GB as ``memory_*_gb``) for a DataFrame."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "memory"}
        d.update({f"memory_{k}_gb": v / 1e9 for k, v in self.memory.items()})
        d["memory_capacity_gb"] = d.pop("memory_capacity_bytes") / 1e9
        d["fits"] = self.fits
        return d
