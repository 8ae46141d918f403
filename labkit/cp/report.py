"""What a context-parallel row holds, and the tables made of CP rows (pure: pandas only).

:data:`COLUMNS` declares every field of a row (name, unit, meaning); :data:`KEY` the fields a
results file upserts by; :func:`select` and :func:`one` the selections notebooks make;
:func:`summary_frame` the table ``labkit cp`` prints.
"""

from __future__ import annotations

from labkit.results import DEVICE_MEMORY_COLUMNS, Column, ms, one_row, select_rows, timed_columns

#: what makes a row a different measurement
KEY = ("variant", "world_size", "seq_len", "hidden", "num_heads", "batch_size", "device")

COLUMNS = (
    Column("variant", "", "full (no mask), causal (contiguous split) or causal_balanced "
                          "(2P chunks, rank r holds r and 2P-1-r)"),
    Column("seq_len", "", "tokens per sequence S, split over the ranks"),
    Column("hidden", "", "hidden size h = heads x head size"),
    Column("num_heads", "", "attention heads"),
    Column("batch_size", "", "sequences b"),
    Column("steps", "", "timed passes per variant, warm-up included"),
    Column("warmup", "", "untimed first passes"),
    Column("measured_steps", "", "timed passes: steps - warmup"),
    Column("seed", "", "seed of Q, K, V and the output gradient"),
    Column("tolerance", "", "max_rel_error at or below which a run matches"),
    Column("matches_single_process", "",
           "output and Q, K, V gradients (float64) equal scaled_dot_product_attention's in one "
           "process, within tolerance (checked before timing)"),
    Column("max_rel_error", "", "largest |ring - one process| / max|one process| over those "
                                "tensors, worst rank"),
    Column("chunks", "", "chunks the sequence is cut into: P, or 2P for causal_balanced"),
    Column("blocks_per_rank", "", "score blocks (chunk x chunk) each rank computes, in rank "
                                  "order (a list)"),
    Column("block_kinds_per_rank", "", "each rank's score blocks by kind, {full, causal} (a "
                                       "chunk against itself under the mask), in rank order"),
    Column("kv_block_bytes", "bytes", "one rank's K and V blocks: 2 b (S/P) h x 4 bytes"),
    Column("ring_bytes_forward_measured", "bytes",
           "bytes one rank sent in the forward (the K/V blocks), counted at the sends"),
    Column("ring_bytes_backward_measured", "bytes",
           "bytes one rank sent in the backward (the blocks' gradients), counted"),
    Column("ring_bytes_formula", "bytes", "per pass: (P-1) x 2 b (S/P) h x 4 B = 2 (P-1)/P "
                                          "x the bytes of K"),
    Column("ring_sends_forward_measured", "", "sends of one rank in the forward, counted"),
    Column("ring_sends_backward_measured", "", "sends of one rank in the backward, counted"),
    Column("ring_sends_formula", "", "per pass: K and V, P-1 times: 2 (P-1)"),
    Column("saved_bytes_per_rank_measured", "bytes",
           "what autograd saved for the backward in each rank's forward, Q, K, V left out "
           "(labkit.memory.SavedActivations; a list in rank order)"),
    Column("saved_bytes_measured", "bytes", "the largest of saved_bytes_per_rank_measured"),
    Column("saved_bytes_formula", "bytes", "labkit.cp.formulas.saved_bytes_per_rank, the "
                                           "busiest rank"),
    Column("saved_bytes_one_rank_measured", "bytes",
           "the same code on one rank holding the whole sequence, measured by rank 0"),
    Column("saved_bytes_one_rank_formula", "bytes", "the formula at P = 1"),
    Column("flops_per_rank", "FLOP", "12 b c^2 h per score block (forward + backward), the "
                                     "busiest rank"),
    *timed_columns("step_time", "forward + backward of the ring", each="pass"),
    *timed_columns("compute_time", "the same with the messages replaced by a loopback, "
                                   "ranks together", each="pass"),
    Column("compute_alone_per_rank_s", "s", "each rank's loopback forward + backward alone "
                                            "(the others waiting), median, in rank order"),
    Column("compute_alone_s", "s", "the largest of compute_alone_per_rank_s"),
    Column("forward_alone_per_rank_s", "s", "each rank's loopback forward alone, median"),
    Column("share_alone_s", "s", "every rank's share (loopback forward + backward) timed alone "
                                 "on each rank in turn, the ranks' median, in rank order: the "
                                 "work's imbalance on one core (P = 1: "
                                 "compute_alone_per_rank_s)"),
    Column("block_time_alone_s", "s", "one score block of each kind the variant computes, "
                                      "{full, causal}: forward + backward of its c x c scores, "
                                      "timed alone on each rank in turn, the ranks' median"),
    Column("exchange_time_s", "s", "one K/V block exchanged with the neighbours, nothing "
                                   "else, p50 of the slowest rank"),
    Column("message_time_s", "s", "the 2 (P-1) exchanges of a forward + backward alone, "
                                  "p50 of the slowest rank"),
    Column("timeline_s", "s",
           "the median timed pass (timeline_step) of every rank, on one clock from the first "
           "rank's start: per ring step the K/V exchange posted, the blocks, the wait, and in "
           "the backward the blocks and the gradients' exchange, {rank, thread, name, cat, "
           "ring_step, direction, start_s, end_s} (a list; its trace: labkit.cp.trace)"),
    Column("timeline_step", "", "which timed pass timeline_s shows (1: the first): the "
                                "median of the slowest rank's"),
    *DEVICE_MEMORY_COLUMNS,
)


def select(df, variant: str | None = None, **equal):
    """The rows of ``variant`` (None: all) with the given ``column=value``s, by world size."""
    return select_rows(df, variant=variant, **equal).sort_values(
        ["variant", "world_size"]).reset_index(drop=True)


def one(df, variant: str, **equal):
    """The one row of ``variant`` with the given ``column=value``s (a pandas Series)."""
    return one_row(df, variant=variant, **equal)


def summary_frame(df):
    """One line per run: the check, the bytes sent counted against the formula, the saved
    bytes against theirs and against one rank, and the step split (ms)."""
    import pandas as pd

    out = []
    for _, r in select(df).iterrows():
        out.append({
            "variant": r["variant"], "ranks": int(r["world_size"]),
            "matches": bool(r["matches_single_process"]),
            "kB_sent_fwd+bwd": (r["ring_bytes_forward_measured"]
                                + r["ring_bytes_backward_measured"]) / 1e3,
            "kB_formula": 2 * r["ring_bytes_formula"] / 1e3,
            "saved_kB": r["saved_bytes_measured"] / 1e3,
            "saved_kB_formula": r["saved_bytes_formula"] / 1e3,
            "saved_vs_1_rank": r["saved_bytes_measured"] / r["saved_bytes_one_rank_formula"],
            "blocks": "/".join(str(n) for n in r["blocks_per_rank"]),
            "step_ms": ms(r["step_time_p50_s"]),
            "compute_ms": ms(r["compute_time_p50_s"]),
            "messages_ms": ms(r["message_time_s"]),
        })
    return pd.DataFrame(out)


SUMMARY_LEGEND = (
    "kB sent = one rank's sends, forward (K/V blocks) + backward (their gradients), counted; "
    "formula 2 x (P-1) x 2 b (S/P) h x 4 B\n"
    "saved = what autograd keeps for the backward on the busiest rank; vs 1 rank = over the "
    "same code on one rank; blocks = score blocks per rank\n"
    "compute = the same pass with a loopback instead of messages; messages = the 2(P-1) "
    "exchanges alone")
