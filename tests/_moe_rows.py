"""A row of the MoE lab as its worker writes it, on 2 ranks with a known routing (a few pairs
over the capacity dropped), for the tests of its laws, sentences and step model."""

from __future__ import annotations

from labkit.moe import formulas, report


def moe_row(**over) -> dict:
    """The row, its all-to-all bytes counted as the formula gives them, ``over`` applied, and
    :func:`labkit.moe.report.derived_fields` added."""
    row = {"world_size": 2, "num_experts": 4, "top_k": 2, "hidden": 128, "ffn": 512,
           "tokens_per_rank": 256, "capacity": 160, "capacity_factor": 1.25,
           "routed_by_rank": [[170, 100, 90, 152], [110, 130, 90, 182]],
           "kept_by_rank": [[160, 100, 90, 152], [110, 130, 90, 160]],
           "a2a_calls_measured": 4, "a2a_calls_formula": 4}
    kept = row["kept_by_rank"]
    row["a2a_bytes_by_call_formula"] = [
        [b["dispatch"], b["combine"], b["dispatch"], b["combine"]]
        for b in (formulas.alltoall_bytes(kept, rank=r, hidden=128) for r in range(2))]
    row["a2a_bytes_by_call_measured"] = [list(c) for c in row["a2a_bytes_by_call_formula"]]
    row.update(over)
    return {**row, **report.derived_fields(row)}
